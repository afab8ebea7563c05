#!/bin/bash
# Data-parallel calibration (issue 17), 1 process versus 2 ranks on this
# machine: wall time and peak RSS (VmHWM via /usr/bin/time) of every rank.
# The ranks run torchrun-style (RANK / WORLD_SIZE / MASTER_* set by this
# script, each under its own /usr/bin/time, 1 intra-op thread each); the
# single process with 1 thread (and with 2 with BENCH_TWO_THREADS=1: the same
# cores either way).
#
#   bench/distributed_bench.sh [SAMPLES] [SEQ_LEN]
# Prints the rows for bench/RESULTS.md.
set -euo pipefail

cd "$(dirname "$0")/.."
samples=${1:-64}
seq_len=${2:-64}
# COMPILATION_MODE=opt for an optimized build (the numbers in RESULTS.md
# say which); the time is LibTorch's kernels either way.
mode=${COMPILATION_MODE:-fastbuild}
bazel build -c "$mode" //tools:tracecut //tests/fixtures:llama_32l >&2
bin=$(bazel info -c "$mode" bazel-bin 2>/dev/null)
tracecut=$bin/tools/tracecut
model=$bin/tests/fixtures/llama_32l.pt
recipe=pipelines/testdata/gptq_w4g128.textproto
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(calibrate "$model" --recipe="$recipe" --synthetic="$samples"
      --seq-len="$seq_len" --batch-size=4 --deterministic-report)

# "wall_s cpu_s rss_mib" of one /usr/bin/time -v log (cpu: user + system).
measure() {
  awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0;
                for (i = 1; i <= n; i++) s = s * 60 + t[i]; wall = s}
              /User time|System time/ {cpu += $2}
              /Maximum resident set size/ {rss = $2 / 1024}
              END {printf "%.1f %.1f %.0f\n", wall, cpu, rss}' "$1"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# The 2-thread single process only on request: on a loaded 2-core machine
# its OpenMP threads wait on each other (705 s against 98 s in one run).
for threads in 1 ${BENCH_TWO_THREADS:+2}; do
  OMP_NUM_THREADS=$threads /usr/bin/time -v "$tracecut" "${args[@]}" \
    -o "$tmp/one_t$threads.pt" 2>"$tmp/one_t$threads.log" >/dev/null
  read -r wall cpu rss < <(measure "$tmp/one_t$threads.log")
  echo "| 1 process, $threads thread(s) | $wall s | $cpu s | $rss MiB |"
done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s.%N)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    OMP_NUM_THREADS=1 /usr/bin/time -v "$tracecut" "${args[@]}" \
    -o "$tmp/two.pt" 2>"$tmp/rank$r.log" >/dev/null &
  pids[r]=$!
done
wait "${pids[0]}" "${pids[1]}"
end=$(date +%s.%N)
for r in 0 1; do
  read -r wall cpu rss < <(measure "$tmp/rank$r.log")
  echo "| 2 ranks, 1 thread each: rank $r | $wall s | $cpu s | $rss MiB |"
done
echo "2 ranks wall (first start to last exit): $(echo "$end - $start" | bc) s"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: ${BENCH_TWO_THREADS:+BENCH_TWO_THREADS=1 }COMPILATION_MODE=$mode bench/distributed_bench.sh $samples $seq_len (commit $(git rev-parse --short HEAD))"
