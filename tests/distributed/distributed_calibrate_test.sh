#!/bin/bash
# Data-parallel calibration end to end: 1 process versus 2 and 3 ranks
# (check_distributed.py), repeated 2-rank runs byte-identical, the
# torchrun-style environment giving the launcher's bytes, and a rank that
# dies or hangs after subgraph 1: every rank exits non-zero within the
# timeout, one error line, no output.
#
#   distributed_calibrate_test.sh TRACECUT MODEL.pt RECIPE PYTHON CHECK.py
set -euo pipefail

tracecut=$1
model=$2
recipe=$3
python=$4
check=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
args=(calibrate "$model" --recipe="$recipe" --synthetic=24 --seq-len=16
      --batch-size=2 --deterministic-report)

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$tracecut" "${args[@]}" -o "$tmp/one.pt" --report="$tmp/one.json" 2>"$tmp/one.log"
for run in a b; do
  "$tracecut" "${args[@]}" --nproc-per-node=2 -o "$tmp/two_$run.pt" \
    --report="$tmp/two_$run.json" 2>"$tmp/two_$run.log"
done
cmp "$tmp/two_a.pt" "$tmp/two_b.pt" || fail "2-rank runs differ (model)"
cmp "$tmp/two_a.json" "$tmp/two_b.json" || fail "2-rank runs differ (report)"
echo "2 ranks twice: byte-identical model and report"
"$tracecut" "${args[@]}" --nproc-per-node=3 -o "$tmp/three.pt" \
  --report="$tmp/three.json" 2>"$tmp/three.log"

# torchrun's environment instead of the launcher: the same bytes.
port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$tracecut" "${args[@]}" -o "$tmp/env.pt" --report="$tmp/env.json" \
    2>"$tmp/env_$r.log" &
  pids[r]=$!
done
wait "${pids[0]}" || fail "torchrun-style rank 0 failed: $(cat "$tmp/env_0.log")"
wait "${pids[1]}" || fail "torchrun-style rank 1 failed: $(cat "$tmp/env_1.log")"
cmp "$tmp/two_a.pt" "$tmp/env.pt" || fail "torchrun-style run differs"
[[ -s "$tmp/env_1.log" ]] && fail "rank 1 printed: $(cat "$tmp/env_1.log")"
echo "torchrun-style environment: the launcher's bytes; rank 1 silent"

"$python" "$check" "$model" "$tmp/one.pt" "2 ranks=$tmp/two_a.pt" \
  "3 ranks=$tmp/three.pt"

# No resume across ranks (yet): refused, not half-done.
if "$tracecut" "${args[@]}" --nproc-per-node=2 --resume -o "$tmp/resume.pt" \
  2>"$tmp/resume.log"; then
  fail "--resume with 2 ranks was accepted"
fi
grep -q "not supported in a data-parallel run" "$tmp/resume.log" ||
  fail "--resume: $(cat "$tmp/resume.log")"

# Faults after subgraph 1: a rank that exits, then one that hangs.
for mode in exit hang; do
  start=$(date +%s)
  set +e
  TRACECUT_DIST_FAULT=1:1:$mode "$tracecut" "${args[@]}" --nproc-per-node=2 \
    --dist-timeout=5 -o "$tmp/fault.pt" --report="$tmp/fault.json" \
    >"$tmp/fault.out" 2>"$tmp/fault.log"
  code=$?
  set -e
  elapsed=$(($(date +%s) - start))
  [[ $code -ne 0 ]] || fail "$mode: exit status 0"
  [[ -e "$tmp/fault.pt" || -e "$tmp/fault.json" ]] && fail "$mode: output left"
  lines=$(wc -l <"$tmp/fault.log")
  [[ $lines -eq 1 ]] || fail "$mode: $lines lines on stderr: $(cat "$tmp/fault.log")"
  # Start-up and calibration of subgraphs 0-1 take a few seconds; the
  # timeout (5 s) bounds the wait after the fault.
  [[ $elapsed -le 60 ]] || fail "$mode: took $elapsed s"
  if [[ $mode == exit ]]; then
    grep -q "rank 1 of 2 failed (exit status 3)" "$tmp/fault.log" ||
      fail "exit: the error does not name rank 1"
  else
    grep -qi "rank 0 of 2 failed.*timed out" "$tmp/fault.log" ||
      fail "hang: the error does not say rank 0 timed out"
  fi
  echo "$mode after subgraph 1: exit $code in $elapsed s: $(cat "$tmp/fault.log")"
done
echo "PASS"
