#!/bin/bash
# Profiles behind bench/PROFILES.md: where the time (or the error) goes in
# the rows whose targets are missed. Writes plain-text reports to OUT_DIR.
#
#   bench/profile.sh [OUT_DIR]      # default bench/profiles
#
# * trace.txt: perf of bench_main tracing the 32-layer hidden-512 Llama 20
#   times: self time by shared object and symbol, time with callees;
# * partition_64l.txt: perf of partition_bench partitioning the 64-layer
#   hidden-64 Llama traced through its layers (7052 nodes) 200 times;
# * transforms_<model>_<variant>.txt: perf of transforms_bench timing one
#   variant (ofi = optimize_for_inference, ours_frozen) alone;
# * gptq_spectrum_<model>.json: Hessian isotropy and GPTQ/RTN layer-output
#   error per Linear of layer 0 (bench/reference/gptq_spectrum.py).
# Same build flags as run_all.sh (BENCH_BAZEL_FLAGS, BENCH_BAZEL_STARTUP).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
OUT="${1:-$ROOT/bench/profiles}"
PY="$ROOT/tools/python"
FLAGS="${BENCH_BAZEL_FLAGS:--c opt}"
STARTUP="${BENCH_BAZEL_STARTUP:-}"
command -v perf >/dev/null || { echo "profile.sh: perf is not installed" >&2; exit 1; }
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# shellcheck disable=SC2086
bazel $STARTUP build $FLAGS --symlink_prefix=/ //bench:bench_main //bench:transforms_bench \
  //bench:gptq_bench //partition:partition_bench //tools:tracecut \
  //tests/fixtures:models
# shellcheck disable=SC2086
BIN="$(bazel $STARTUP info $FLAGS bazel-bin 2>/dev/null)"
FIX="$BIN/tests/fixtures"

# perf_report NAME CALLGRAPH CMD...: records CMD, writes NAME.txt: self time
# by shared object and by symbol; with CALLGRAPH=1 (DWARF unwinding) also
# time including callees, by symbol.
perf_report() {
  local name=$1 cg=$2
  shift 2
  local rec=(-F 999)
  if ((cg)); then rec=(-F 300 --call-graph dwarf,16384); fi
  perf record -q "${rec[@]}" -o "$WORK/$name.data" -- "$@" >"$WORK/$name.stdout"
  {
    echo "# $*"
    echo "# stdout: $(cat "$WORK/$name.stdout")"
    echo "## self time by shared object"
    perf report -i "$WORK/$name.data" --stdio --no-children -g none --sort dso \
      --percent-limit 1 2>/dev/null | grep -v '^#' | grep -v '^$'
    echo "## self time by symbol"
    perf report -i "$WORK/$name.data" --stdio --no-children -g none --sort dso,sym \
      --percent-limit 0.7 2>/dev/null | grep -v '^#' | grep -v '^$' | cut -c1-200
    if ((cg)); then
      echo "## time including callees, by symbol"
      perf report -i "$WORK/$name.data" --stdio --children --sort sym -g none \
        --percent-limit 2 2>/dev/null | grep -v '^#' | grep -v '^$' | cut -c1-200
    fi
  } | sed "s|$WORK/||g" >"$OUT/$name.txt"
  echo "profile.sh: wrote $OUT/$name.txt" >&2
}

echo "== row 1: trace" >&2
$PY -P tests/fixtures/gen_llama.py --layers 32 --hidden 512 --out "$WORK/llama_32l.pt"
perf_report trace 1 "$BIN/bench/bench_main" "$WORK/llama_32l.pt" --skip_runtime \
  --partition_reps=1 --trace_reps=20

echo "== row 3: partition" >&2
$PY -P tests/fixtures/gen_llama.py --layers 64 --hidden 64 --out "$WORK/llama_64l.pt"
"$BIN/tools/tracecut" trace "$WORK/llama_64l.pt" -o "$WORK/llama_64l.txt"
perf_report partition_64l 1 "$BIN/partition/partition_bench" "$WORK/llama_64l.txt" --reps=200

echo "== row 5: transforms vs optimize_for_inference" >&2
for variant in ofi ours_frozen; do
  perf_report "transforms_cnn_$variant" 0 "$BIN/bench/transforms_bench" "$FIX/cnn.pt" \
    --passes=fuse-batchnorm2d-in-conv2d,eliminate-dead-code --runs=5000 --only=$variant
  perf_report "transforms_bert_$variant" 0 "$BIN/bench/transforms_bench" "$FIX/bert.pt" \
    --passes=merge-linears,change-truediv-to-mul-by-inverse,eliminate-dead-code \
    --runs=500 --only=$variant
done

echo "== row 6: GPTQ vs RTN per Linear" >&2
for spec in llama:model.layers.0 opt:model.decoder.layers.0; do
  m=${spec%%:*}
  "$BIN/bench/gptq_bench" solve "$FIX/$m.pt" --layer="${spec#*:}" \
    --out="$WORK/$m.problems.pt" --samples=128 --seq=32 --reps=1 >/dev/null
  $PY -P bench/reference/gptq_spectrum.py "$WORK/$m.problems.pt" >"$OUT/gptq_spectrum_$m.json"
  echo "profile.sh: wrote $OUT/gptq_spectrum_$m.json" >&2
done
