#!/bin/bash
# Data-parallel calibration end to end: 1 process versus 2 and 3 ranks
# (check_distributed.py), repeated 2-rank runs byte-identical, the
# torchrun-style environment giving the launcher's bytes, --stop-after and
# --resume (byte-identical; another world size refused), a rank that dies or
# hangs after subgraph 1 (every rank exits non-zero within the timeout, one
# error line, no output; --resume then finishes with the same bytes), and
# weights streamed from a checkpoint directory on every rank.
#
#   distributed_calibrate_test.sh TRACECUT MODEL.pt RECIPE PYTHON CHECK.py \
#       CHECK_STREAMED.py STREAM_RECIPE
set -euo pipefail

tracecut=$1
model=$2
recipe=$3
python=$4
check=$5
streamed=$6
stream_recipe=$7
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

# --stop-after then --resume: every rank stops after subgraph 1 (0-based)
# and the resumed run gives the uninterrupted 2-rank run's bytes; so does a
# stop with the launcher resumed torchrun-style. Resuming with another world
# size is refused with one error naming both.
"$tracecut" "${args[@]}" --nproc-per-node=2 --stop-after=1 -o "$tmp/stop.pt" \
  --report="$tmp/stop.json" 2>"$tmp/stop.log"
grep -q "stopped after subgraph 2/3" "$tmp/stop.log" ||
  fail "--stop-after: $(cat "$tmp/stop.log")"
[[ -e "$tmp/stop.pt" || -e "$tmp/stop.json" ]] && fail "--stop-after wrote output"
for r in 0 1; do
  ls "$tmp/stop.pt.run/rank-$r-of-2/" | grep -q '^state.pt.00002$' ||
    fail "rank $r kept no checkpoint: $(ls -R "$tmp/stop.pt.run")"
done
if "$tracecut" "${args[@]}" --nproc-per-node=3 --resume -o "$tmp/stop.pt" \
  --report="$tmp/stop.json" 2>"$tmp/world.log"; then
  fail "--resume with 3 ranks of a 2-rank checkpoint was accepted"
fi
grep -q "made with world size 2, this run has world size 3" "$tmp/world.log" ||
  fail "world size: $(cat "$tmp/world.log")"
[[ $(wc -l <"$tmp/world.log") -eq 1 ]] || fail "world size: $(cat "$tmp/world.log")"
if "$tracecut" "${args[@]}" --resume -o "$tmp/stop.pt" 2>"$tmp/world1.log"; then
  fail "--resume in one process of a 2-rank checkpoint was accepted"
fi
grep -q "world size 2, this run has world size 1 (one process)" \
  "$tmp/world1.log" || fail "world size 1: $(cat "$tmp/world1.log")"
echo "another world size: $(cat "$tmp/world.log")"
"$tracecut" "${args[@]}" --nproc-per-node=2 --resume -o "$tmp/stop.pt" \
  --report="$tmp/stop.json" 2>"$tmp/resume.log"
grep -q "resuming from .*after subgraph 2/3" "$tmp/resume.log" ||
  fail "did not resume: $(cat "$tmp/resume.log")"
cmp "$tmp/two_a.pt" "$tmp/stop.pt" || fail "stopped and resumed: model differs"
cmp "$tmp/two_a.json" "$tmp/stop.json" || fail "stopped and resumed: report differs"
[[ -e "$tmp/stop.pt.run" ]] && fail "run directory left: $(ls -R "$tmp/stop.pt.run")"
echo "2 ranks stopped after subgraph 1 and resumed: byte-identical"
# Ranks one subgraph apart (rank 1 killed before its checkpoint after
# subgraph 1 was written, simulated by removing it): both resume after
# subgraph 0, rank 0 re-runs subgraph 1; the same bytes.
"$tracecut" "${args[@]}" --nproc-per-node=2 --stop-after=1 -o "$tmp/apart.pt" \
  --report="$tmp/apart.json" 2>/dev/null
rm "$tmp/apart.pt.run/rank-1-of-2/state.pt.00002"
"$tracecut" "${args[@]}" --nproc-per-node=2 --resume -o "$tmp/apart.pt" \
  --report="$tmp/apart.json" 2>"$tmp/apart.log"
grep -q "resuming from .*after subgraph 1/3" "$tmp/apart.log" ||
  fail "ranks apart: $(cat "$tmp/apart.log")"
cmp "$tmp/two_a.pt" "$tmp/apart.pt" || fail "ranks apart: model differs"
cmp "$tmp/two_a.json" "$tmp/apart.json" || fail "ranks apart: report differs"
echo "ranks one subgraph apart resume from the earlier: byte-identical"
"$tracecut" "${args[@]}" --nproc-per-node=2 --stop-after=0 -o "$tmp/envr.pt" \
  --report="$tmp/envr.json" 2>"$tmp/envr.log"
port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$tracecut" "${args[@]}" --resume -o "$tmp/envr.pt" \
    --report="$tmp/envr.json" 2>"$tmp/envr_$r.log" &
  pids[r]=$!
done
wait "${pids[0]}" || fail "torchrun-style resume, rank 0: $(cat "$tmp/envr_0.log")"
wait "${pids[1]}" || fail "torchrun-style resume, rank 1: $(cat "$tmp/envr_1.log")"
cmp "$tmp/two_a.pt" "$tmp/envr.pt" || fail "torchrun-style resume differs"
echo "stopped with --nproc-per-node, resumed torchrun-style: byte-identical"

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
  # Every rank kept its checkpoint: --resume finishes the run, with the
  # uninterrupted run's bytes.
  grep -q "kept: rerun the same command with --resume" "$tmp/fault.log" ||
    fail "$mode: no word of the kept checkpoints"
  "$tracecut" "${args[@]}" --nproc-per-node=2 --resume -o "$tmp/fault.pt" \
    --report="$tmp/fault.json" 2>"$tmp/fault_resume.log" ||
    fail "$mode: --resume failed: $(cat "$tmp/fault_resume.log")"
  grep -q "resuming from" "$tmp/fault_resume.log" ||
    fail "$mode: did not resume: $(cat "$tmp/fault_resume.log")"
  cmp "$tmp/two_a.pt" "$tmp/fault.pt" || fail "$mode: resumed model differs"
  cmp "$tmp/two_a.json" "$tmp/fault.json" || fail "$mode: resumed report differs"
  echo "$mode: --resume after the fault gives the uninterrupted run's bytes"
  rm -rf "$tmp/fault.pt" "$tmp/fault.json"
done

# Streaming: a checkpoint directory whose .pt2 holds no weights (export
# --meta). 2 ranks stream like one process (only rank 0 writes), with the
# same tensors as 2 ranks with the whole model loaded; against one process
# streamed: check_streamed.py's criteria (issue 17).
"$python" "$streamed" make "$tmp/ckpt"
"$tracecut" export "$tmp/ckpt" --meta -o "$tmp/ckpt/model.pt2" 2>/dev/null
sargs=(calibrate "$tmp/ckpt" --recipe="$stream_recipe" --synthetic=24
       --seq-len=16 --batch-size=2 --deterministic-report)
"$tracecut" "${sargs[@]}" -o "$tmp/s_one" --report="$tmp/s_one.json" \
  2>"$tmp/s_one.log"
"$tracecut" "${sargs[@]}" --nproc-per-node=2 -o "$tmp/s_two" \
  --report="$tmp/s_two.json" 2>"$tmp/s_two.log"
grep -q "weights streamed" "$tmp/s_two.log" ||
  fail "2 ranks did not stream: $(cat "$tmp/s_two.log")"
"$tracecut" "${sargs[@]}" --nproc-per-node=2 --stream-weights=false \
  -o "$tmp/s_whole" --report="$tmp/s_whole.json" 2>"$tmp/s_whole.log"
grep -q "weights streamed" "$tmp/s_whole.log" && fail "--stream-weights=false streamed"
cmp "$tmp/s_two.json" "$tmp/s_whole.json" || fail "streamed and whole reports differ"
"$python" "$streamed" same "$tmp/s_two" "$tmp/s_whole"
[[ "$(ls "$tmp/s_one")" == "$(ls "$tmp/s_two")" ]] ||
  fail "files differ: $(ls "$tmp/s_one") vs $(ls "$tmp/s_two")"
for f in config.json model.safetensors.index.json; do
  cmp "$tmp/s_one/$f" "$tmp/s_two/$f" || fail "$f differs"
done
"$python" "$streamed" compare "$tmp/s_one" "$tmp/s_two" "$tmp/s_one.json" \
  "$tmp/s_two.json"
# Streamed, stopped and resumed: the same bytes.
"$tracecut" "${sargs[@]}" --nproc-per-node=2 --stop-after=1 -o "$tmp/s_res" \
  2>/dev/null
"$tracecut" "${sargs[@]}" --nproc-per-node=2 --resume -o "$tmp/s_res" \
  2>"$tmp/s_res.log"
diff -r "$tmp/s_two" "$tmp/s_res" || fail "streamed, stopped and resumed differs"
echo "2 ranks streamed, stopped after subgraph 1 and resumed: byte-identical"
echo "PASS"
