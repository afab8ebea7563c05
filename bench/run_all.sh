#!/bin/bash
# Runs every benchmark side by side with its peer in one go and writes
# bench/RESULTS.md, bench/results.json and bench/results.png.
#
#   bench/run_all.sh [--quick]     # --quick: 8-layer model, fewer runs
#
# Builds with the repository's default configuration (fastbuild): building
# LibTorch-heavy code with -c opt from scratch takes too long on small
# machines; set BENCH_BAZEL_FLAGS="-c opt" to measure optimised code.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY=/usr/bin/python3
FLAGS="${BENCH_BAZEL_FLAGS:-}"
# Bazel startup options, e.g. --output_base=/tmp/bench-ob to avoid waiting on
# a busy shared server (the disk cache keeps that cheap).
STARTUP="${BENCH_BAZEL_STARTUP:-}"
LAYERS=32
RUNS=20
if [ "${1:-}" = "--quick" ]; then
  LAYERS=8
  RUNS=10
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
RAW="$WORK/raw.jsonl"
: >"$RAW"

# shellcheck disable=SC2086
bazel $STARTUP build $FLAGS //bench:bench_main //tools:tracecut
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
echo "{\"row\": \"fx_llama\", \"layers\": $LAYERS, \"data\": $($PY -P bench/fx_trace_ref.py --layers "$LAYERS" --hidden 512)}" >>"$RAW"

echo "== row 3: partition curve (hidden 64, decoder layers as leaves)" >&2
for n in 8 16 32 64 128; do
  m="$WORK/llama_p${n}.pt"
  $GEN --layers "$n" --hidden 64 --out "$m"
  "$TRACECUT" trace "$m" --leaf=LlamaDecoderLayer --format=json -o "$WORK/p${n}.json"
  echo "{\"row\": \"ours_partition\", \"layers\": $n, \"data\": $("$BENCH" "$m" --leaf=LlamaDecoderLayer --skip_runtime --partition_reps=20)}" >>"$RAW"
  echo "{\"row\": \"ref_partition\", \"layers\": $n, \"data\": $($PY -P bench/reference/partition_ref.py "$WORK/p${n}.json" --reps=3)}" >>"$RAW"
done

{
  echo "command: bench/run_all.sh $*"
  echo "bazel flags: ${FLAGS:-(default fastbuild)}"
  echo "OMP_NUM_THREADS=$OMP_NUM_THREADS"
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core)' | sed 's/  */ /g'
  free -g | awk '/^Mem:/{print "RAM: " $2 " GiB"}'
  echo "commit: $(git rev-parse --short HEAD)"
} >"$WORK/machine.txt"
$PY -P bench/report.py "$RAW" "$WORK/machine.txt" bench
cat bench/RESULTS.md
