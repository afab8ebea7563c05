#!/bin/bash
# Runs every benchmark side by side with its peer in one go and writes
# bench/RESULTS.md, bench/results.json and bench/results.png.
#
#   bench/run_all.sh [--quick]     # --quick: 8-layer model, fewer runs
#
# Builds with -c opt (optimised C++ is what users run); BENCH_BAZEL_FLAGS
# overrides it (BENCH_BAZEL_FLAGS=" " for the default fastbuild).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="$ROOT/tools/python"
FLAGS="${BENCH_BAZEL_FLAGS:--c opt}"
# Bazel startup options, e.g. --output_base=/tmp/bench-ob to avoid waiting on
# a busy shared server (the disk cache keeps that cheap).
STARTUP="${BENCH_BAZEL_STARTUP:-}"
LAYERS=32
RUNS=20
# Row 4: calibration batches; row 5: timed calls; row 6: GPTQ problem size.
P_SAMPLES=16
P_RUNS=3
T_RUNS=200
G_HIDDEN=1024
G_REPS=3
if [ "${1:-}" = "--quick" ]; then
  LAYERS=8
  RUNS=10
  P_SAMPLES=8
  P_RUNS=2
  T_RUNS=50
  G_HIDDEN=512
  G_REPS=1
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
RAW="$WORK/raw.jsonl"
LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
: >"$RAW"

# No convenience symlinks: re-pointed at another output base (STARTUP), the
# workspace's bazel-<name> link would be walked as a package by `//...`.
# shellcheck disable=SC2086
bazel $STARTUP build $FLAGS --symlink_prefix=/ //bench:bench_main //tools:tracecut \
  //bench:pipeline_bench //bench:transforms_bench //bench:gptq_bench \
  //tests/fixtures:models
# shellcheck disable=SC2086
BIN="$(bazel $STARTUP info $FLAGS bazel-bin 2>/dev/null)"
BENCH="$BIN/bench/bench_main"
TRACECUT="$BIN/tools/tracecut"
GEN="$PY -P $ROOT/tests/fixtures/gen_llama.py"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

echo "== rows 1-2: trace and runtime, ${LAYERS}-layer hidden-512 Llama" >&2
MODEL="$WORK/llama_${LAYERS}l.pt"
$GEN --layers "$LAYERS" --hidden 512 --out "$MODEL"
echo "{\"row\": \"ours_llama\", \"layers\": $LAYERS, \"data\": $("$BENCH" "$MODEL" --runs="$RUNS" --partition_reps=5)}" >>"$RAW"
echo "{\"row\": \"export_llama\", \"layers\": $LAYERS, \"data\": $($PY -P bench/trace_ref.py --layers "$LAYERS" --hidden 512)}" >>"$RAW"

echo "== row 3: partition curve (hidden 64, decoder layers as leaves; then traced through: *_full)" >&2
for n in 8 16 32 64 128; do
  m="$WORK/llama_p${n}.pt"
  $GEN --layers "$n" --hidden 64 --out "$m"
  "$TRACECUT" trace "$m" --leaf=LlamaDecoderLayer --format=json -o "$WORK/p${n}.json"
  echo "{\"row\": \"ours_partition\", \"layers\": $n, \"data\": $("$BENCH" "$m" --leaf=LlamaDecoderLayer --skip_runtime --partition_reps=20)}" >>"$RAW"
  echo "{\"row\": \"ref_partition\", \"layers\": $n, \"data\": $($PY -P bench/reference/partition_ref.py "$WORK/p${n}.json" --reps=5)}" >>"$RAW"
  "$TRACECUT" trace "$m" --format=json -o "$WORK/f${n}.json"
  echo "{\"row\": \"ours_partition_full\", \"layers\": $n, \"data\": $("$BENCH" "$m" --skip_runtime --partition_reps=10)}" >>"$RAW"
  echo "{\"row\": \"ref_partition_full\", \"layers\": $n, \"data\": $($PY -P bench/reference/partition_ref.py "$WORK/f${n}.json" --reps=3)}" >>"$RAW"
done

echo "== row 4: sequential calibration overhead, ${LAYERS}-layer hidden-512 Llama" >&2
# One process per mode, so that each peak RSS is that mode's alone.
for mode in plain sequential basic; do
  echo "{\"row\": \"pipeline_$mode\", \"layers\": $LAYERS, \"data\": $("$BIN/bench/pipeline_bench" "$MODEL" --mode=$mode --samples=$P_SAMPLES --seq=64 --batch=4 --runs=$P_RUNS)}" >>"$RAW"
done

echo "== row 5: transforms vs optimize_for_inference (cnn, bert fixtures)" >&2
FIX="$BIN/tests/fixtures"
CNN_PASSES=fuse-batchnorm2d-in-conv2d,eliminate-dead-code
BERT_PASSES=merge-linears,change-truediv-to-mul-by-inverse,eliminate-dead-code
echo "{\"row\": \"transforms_cnn\", \"layers\": 0, \"data\": $("$BIN/bench/transforms_bench" "$FIX/cnn.pt" --passes=$CNN_PASSES --runs=$T_RUNS)}" >>"$RAW"
echo "{\"row\": \"transforms_bert\", \"layers\": 0, \"data\": $("$BIN/bench/transforms_bench" "$FIX/bert.pt" --passes=$BERT_PASSES --runs=$T_RUNS)}" >>"$RAW"

echo "== row 6: GPTQ solve vs the Python fasterquant; GPTQ vs RTN logits" >&2
GM="$WORK/llama_gptq.pt"
$GEN --layers 2 --hidden "$G_HIDDEN" --out "$GM"
echo "{\"row\": \"gptq_solve\", \"layers\": 2, \"data\": $("$BIN/bench/gptq_bench" solve "$GM" --out="$WORK/gptq_problems.pt" --reps=$G_REPS)}" >>"$RAW"
echo "{\"row\": \"gptq_solve_ref\", \"layers\": 2, \"data\": $($PY -P bench/reference/gptq_ref.py "$WORK/gptq_problems.pt" --reps=$G_REPS)}" >>"$RAW"
for m in llama opt; do
  echo "{\"row\": \"gptq_logits_$m\", \"layers\": 2, \"data\": $("$BIN/bench/gptq_bench" logits "$FIX/$m.pt")}" >>"$RAW"
done

{
  echo "command: bench/run_all.sh $*"
  echo "bazel flags: ${FLAGS:-(default fastbuild)}"
  echo "OMP_NUM_THREADS=$OMP_NUM_THREADS"
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core)' | sed 's/  */ /g'
  free -g | awk '/^Mem:/{print "RAM: " $2 " GiB"}'
  echo "load average at start / end: $LOAD_START / $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo ' (+ uncommitted changes)')"
} >"$WORK/machine.txt"
$PY -P bench/report.py "$RAW" "$WORK/machine.txt" bench
cat bench/RESULTS.md
