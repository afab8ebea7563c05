#!/bin/bash
# Kills `tracecut calibrate` with SIGKILL after its first checkpoint, resumes
# it with --resume in a new process, and checks that the model and report
# are byte-identical to those of an uninterrupted run.
#
#   calibrate_kill_test.sh TRACECUT MODEL.pt RECIPE.textproto
set -euo pipefail

tracecut=$1
model=$2
recipe=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
mkdir -p "$tmp/full" "$tmp/killed"
args=(calibrate "$model" --recipe="$recipe" --synthetic=600 --batch-size=4
      --deterministic-report)

"$tracecut" "${args[@]}" -o "$tmp/full/m.pt" --report="$tmp/full/r.json" \
  2>"$tmp/full.log"

"$tracecut" "${args[@]}" -o "$tmp/killed/m.pt" --report="$tmp/killed/r.json" \
  2>"$tmp/killed.log" &
pid=$!
for _ in $(seq 1 1200); do
  if [[ -e "$tmp/killed/m.pt.run/state.pt" ]]; then break; fi
  sleep 0.05
done
if ! kill -0 "$pid" 2>/dev/null; then
  echo "FAIL: the run finished before it could be killed" >&2
  exit 1
fi
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
if [[ -e "$tmp/killed/m.pt" || -e "$tmp/killed/r.json" ]]; then
  echo "FAIL: a killed run left outputs" >&2
  exit 1
fi
echo "killed after: $(grep -c 'propagate\|calibrate' "$tmp/killed.log" || true) steps"

"$tracecut" "${args[@]}" -o "$tmp/killed/m.pt" --report="$tmp/killed/r.json" \
  --resume 2>"$tmp/resumed.log"
grep -q "resuming from" "$tmp/resumed.log" || {
  echo "FAIL: the second run did not resume" >&2
  cat "$tmp/resumed.log" >&2
  exit 1
}
cmp "$tmp/full/m.pt" "$tmp/killed/m.pt"
cmp "$tmp/full/r.json" "$tmp/killed/r.json"
if [[ -e "$tmp/killed/m.pt.run" ]]; then
  echo "FAIL: the run directory was not removed" >&2
  exit 1
fi
echo "PASS: killed-then-resumed output is byte-identical"
