#!/bin/bash
# Partition at scale (issue 17): builds partition_bench with -c opt and runs
# bench/partition_scale.py (see its docstring) over the growth curve.
#
#   bench/partition_scale.sh [--runs=N] [--cold] [--ref] [--before=BIN] [--quick]
#
# TRACECUT=path/to/tracecut to trace the Llama graphs with an existing
# binary; otherwise //tools:tracecut is built (default configuration: only
# partitioning is timed). BENCH_BAZEL_FLAGS as in run_all.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
FLAGS="${BENCH_BAZEL_FLAGS:--c opt}"
# shellcheck disable=SC2086
bazel build $FLAGS //partition:partition_bench
# shellcheck disable=SC2086
BENCH="$(bazel info $FLAGS bazel-bin 2>/dev/null)/partition/partition_bench"
if [[ -z "${TRACECUT:-}" ]]; then
  bazel build //tools:tracecut
  TRACECUT="$(bazel info bazel-bin 2>/dev/null)/tools/tracecut"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "command: bench/partition_scale.sh $*"
echo "commit: $(git rev-parse --short HEAD)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
tools/python bench/partition_scale.py "$BENCH" --tracecut="$TRACECUT" "$@"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
