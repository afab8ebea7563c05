#!/bin/bash
# `tracecut calibrate` under signals and concurrency (issue: robust under
# faults):
#  * SIGINT and SIGTERM stop the run at the next safe point: exit 128+signal,
#    one line saying how to resume, no output, no spill file left (neither in
#    the run directory nor in TMPDIR), the checkpoint kept; --resume then
#    gives output byte-identical to an uninterrupted run;
#  * a second run on the same output while one runs fails at once, naming
#    the first one's pid;
#  * the spill files of a run killed with SIGKILL are removed by the next run
#    on the same output.
#
#   calibrate_signal_test.sh TRACECUT MODEL.pt RECIPE.textproto
set -euo pipefail

tracecut=$1
model=$2
recipe=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
export TMPDIR="$tmp/tmpdir"
mkdir -p "$TMPDIR"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# A tiny activation budget, so the run spills (into RUN_DIR/spill).
sed '/^cache {/,$d' "$recipe" >"$tmp/recipe.textproto"
echo 'cache { memory_budget_bytes: 65536 }' >>"$tmp/recipe.textproto"
args=(calibrate "$model" --recipe="$tmp/recipe.textproto" --synthetic=600
      --batch-size=4 --deterministic-report)

mkdir -p "$tmp/full"
"$tracecut" "${args[@]}" -o "$tmp/full/m.pt" --report="$tmp/full/r.json" \
  2>"$tmp/full.log"

# Starts a run on OUT_DIR/m.pt in the background (its pid in $pid) and waits
# for its first checkpoint.
start_run() {
  local dir=$1
  mkdir -p "$dir"
  "$tracecut" "${args[@]}" -o "$dir/m.pt" --report="$dir/r.json" \
    2>"$dir/log" &
  pid=$!
  # However long a loaded machine takes: until the checkpoint appears or
  # the run ends.
  while [[ ! -e "$dir/m.pt.run/state.pt" ]] && kill -0 "$pid" 2>/dev/null; do
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null || fail "the run on $dir finished too early"
}

for sig in INT TERM; do
  dir="$tmp/$sig"
  start_run "$dir"
  kill "-$sig" "$pid"
  rc=0
  wait "$pid" || rc=$?
  want=$((128 + $(kill -l "$sig")))
  [[ $rc -eq $want ]] || fail "SIG$sig: exit $rc, expected $want; $(cat "$dir/log")"
  last=$(grep -v '^\[tracecut\] ' "$dir/log" | tail -1)
  [[ $last == *"interrupted by SIG$sig"*"--resume"* ]] ||
    fail "SIG$sig: no resume hint: $last"
  [[ ! -e "$dir/m.pt" && ! -e "$dir/r.json" ]] || fail "SIG$sig: left outputs"
  [[ -e "$dir/m.pt.run/state.pt" ]] || fail "SIG$sig: the checkpoint is gone"
  if [[ -n "$(ls -A "$dir/m.pt.run/spill" 2>/dev/null)" ]]; then
    fail "SIG$sig: spill files left: $(ls "$dir/m.pt.run/spill")"
  fi
  [[ -z "$(ls -A "$TMPDIR")" ]] || fail "SIG$sig: files left in TMPDIR"
  "$tracecut" "${args[@]}" -o "$dir/m.pt" --report="$dir/r.json" --resume \
    2>"$dir/resumed.log" || fail "SIG$sig: resume failed: $(cat "$dir/resumed.log")"
  cmp "$tmp/full/m.pt" "$dir/m.pt"
  cmp "$tmp/full/r.json" "$dir/r.json"
  [[ ! -e "$dir/m.pt.run" ]] || fail "SIG$sig: run directory not removed"
  echo "ok: SIG$sig stops cleanly (exit $rc) and resumes byte-identically"
done

# Two runs, one output.
dir="$tmp/concurrent"
start_run "$dir"
first=$pid
rc=0
"$tracecut" "${args[@]}" -o "$dir/m.pt" 2>"$dir/second.log" || rc=$?
[[ $rc -eq 1 ]] || fail "second run: exit $rc, expected 1"
grep -q "another tracecut run (pid $first) is writing $dir/m.pt" \
  "$dir/second.log" || fail "second run: $(cat "$dir/second.log")"
echo "ok: a second run on the same output is refused"

# SIGKILL leaves spill files behind; the next run on the output removes them.
kill -9 "$first"
wait "$first" 2>/dev/null || true
mkdir -p "$dir/m.pt.run/spill"
touch "$dir/m.pt.run/spill/tracecut-$first-0-leftover.pt"
"$tracecut" "${args[@]}" -o "$dir/m.pt" --report="$dir/r.json" --resume \
  2>"$dir/resumed.log" || fail "after SIGKILL: $(cat "$dir/resumed.log")"
cmp "$tmp/full/m.pt" "$dir/m.pt"
[[ ! -e "$dir/m.pt.run" ]] || fail "after SIGKILL: run directory left"
[[ -z "$(ls -A "$TMPDIR")" ]] || fail "after SIGKILL: files left in TMPDIR"
echo "ok: a SIGKILLed run's leftovers are removed by the next run"
echo "PASS"
