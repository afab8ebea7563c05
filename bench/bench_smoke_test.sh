#!/bin/bash
# Smoke test of the row 4-6 benchmark binaries and the GPTQ reference: each
# runs once on a small fixture with minimal repetitions and must print one
# JSON object with the keys bench/report.py reads and outputs that agree.
# Not a timing test: nothing here looks at how long anything took.
set -euo pipefail
R="${TEST_SRCDIR}/${TEST_WORKSPACE}"
FIX="$R/tests/fixtures"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
PY="${TRACECUT_PYTHON:?set by the BUILD rule}"
export OMP_NUM_THREADS=1

# check NAME JSON PYTHON_EXPR: JSON must parse and PYTHON_EXPR (on `d`) hold.
check() {
  echo "$2" | $PY -c '
import json, math, sys
name, expr = sys.argv[1], sys.argv[2]
d = json.loads(sys.stdin.read())
if not eval(expr):
    sys.exit(f"{name}: expected {expr}, got {d}")
' "$1" "$3"
  echo "ok: $1"
}

for mode in plain sequential basic; do
  out="$("$R/bench/pipeline_bench" "$FIX/llama.pt" --mode=$mode --samples=2 --seq=8 --batch=1 --runs=1)"
  check "pipeline_bench $mode" "$out" 'd["seconds"] > 0 and d["peak_rss_bytes"] > 0 and d["batches"] == 2'
done
out="$("$R/bench/pipeline_bench" "$FIX/llama.pt" --mode=sequential --samples=2 --seq=8 --batch=1 --runs=1)"
check "pipeline_bench sequential cache" "$out" \
  'd["subgraphs"] >= 3 and d["cache_peak_bytes"] > 0 and d["linear_calls_per_pass"] > 0'

out="$("$R/bench/transforms_bench" "$FIX/cnn.pt" --passes=fuse-batchnorm2d-in-conv2d --runs=1 --inner=1)"
check "transforms_bench cnn" "$out" \
  'd["passes_changed"] == 1 and all(d["max_err_" + v] <= 1e-4 * max(1.0, d["output_abs_max"]) for v in ("ofi", "ours", "ours_frozen", "ours_ofi")) and d["ours_frozen_s"] > 0'

# 32x16 = 512 tokens, more than any Linear's 256 inputs: with fewer, H is
# rank-deficient, damping alone conditions it, and the solve amplifies ulp
# differences (BLAS kernels differ with alignment, e.g. under ASan) into
# different rounding decisions on a third of down_proj's weights.
out="$("$R/bench/gptq_bench" solve "$FIX/llama.pt" --out="$TMP/problems.pt" --samples=32 --seq=16 --reps=1)"
check "gptq_bench solve" "$out" 'len(d["layers"]) == 7 and d["total_s"] > 0'
out="$($PY -P "$R/bench/reference/gptq_ref.py" "$TMP/problems.pt" --reps=1)"
# Same H, W and settings: the reference must give our weights, up to rare
# one-step rounding flips from float reassociation.
check "gptq_ref" "$out" \
  'len(d["layers"]) == 7 and all(l["frac_weights_differing"] < 0.01 for l in d["layers"])'

out="$("$R/bench/gptq_bench" logits "$FIX/llama.pt" --samples=8 --seq=8 --eval=2)"
check "gptq_bench logits" "$out" \
  'all(math.isfinite(d[k]) and d[k] > 0 for k in ("gptq_rel_err", "rtn_rel_err"))'

# Google Benchmark's JSON: every micro-benchmark ran (GPTQ at the small size).
out="$("$R/bench/micro_bench" "$FIX/llama.pt" --benchmark_min_time=0.01 \
  --benchmark_format=json --benchmark_filter='^BM_([A-Za-z]+|GptqQuantize/256)$')"
check "micro_bench" "$out" \
  'sorted(b["name"] for b in d["benchmarks"]) == ["BM_GptqQuantize/256", "BM_InterpreterRun", "BM_LoweredForward", "BM_ParseJson", "BM_PartitionGraph", "BM_PlanToJson", "BM_Trace"] and all(b["real_time"] > 0 for b in d["benchmarks"])'
