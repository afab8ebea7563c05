#!/bin/bash
# `tracecut calibrate` out of memory (issue: robust under faults): under an
# address-space limit (ulimit -v) a little above what a small run needs, a
# run whose activations need far more (--synthetic=65536 --seq-len=64, the
# most samples calibration data may have: about 4 GiB held between
# subgraphs) fails with an error, not a crash: exit 1..127 (no
# signal), one stderr line saying it is out of memory and how much it could
# not allocate, no output model or report, no spill or temporary file; a
# run directory is left only with a checkpoint to --resume from.
#
#   calibrate_oom_test.sh TRACECUT MODEL.pt RECIPE.textproto
set -euo pipefail

tracecut=$1
model=$2
recipe=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
export TMPDIR="$tmp/tmpdir"
mkdir -p "$TMPDIR"
# Fewer threads and malloc arenas: less address space reserved up front, so
# the limit below is mostly what the run allocates.
export OMP_NUM_THREADS=1 MALLOC_ARENA_MAX=2

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# The address space a small run needs: its VmPeak, sampled until it exits.
mkdir -p "$tmp/small"
"$tracecut" calibrate "$model" --recipe="$recipe" --synthetic=8 \
  -o "$tmp/small/m.pt" 2>"$tmp/small.log" &
pid=$!
peak_kb=0
while kill -0 "$pid" 2>/dev/null; do
  kb=$(awk '/^VmPeak:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  if [[ -n "$kb" && "$kb" -gt "$peak_kb" ]]; then peak_kb=$kb; fi
  sleep 0.02
done
wait "$pid" || fail "the small run failed: $(cat "$tmp/small.log")"
[[ "$peak_kb" -gt 0 ]] || fail "could not read the small run's VmPeak"
limit_kb=$((peak_kb + 256 * 1024))
echo "small run: VmPeak $((peak_kb / 1024)) MiB; limit $((limit_kb / 1024)) MiB"

out="$tmp/big"
mkdir -p "$out"
rc=0
(
  ulimit -v "$limit_kb"
  exec "$tracecut" calibrate "$model" --recipe="$recipe" --synthetic=65536 \
    --seq-len=64 --batch-size=1024 -o "$out/m.pt" --report="$out/r.json"
) 2>"$out/log" || rc=$?
grep -v '^\[tracecut\] ' "$out/log" >"$out/errors" || true
echo "exit $rc: $(cat "$out/errors")"
[[ $rc -ne 0 ]] || fail "the run succeeded under a ${limit_kb} KiB limit"
[[ $rc -lt 128 ]] || fail "killed by a signal (exit $rc): $(tail -5 "$out/log")"
[[ $(grep -c '' "$out/errors") -eq 1 ]] ||
  fail "expected one error line, got: $(cat "$out/errors")"
grep -q 'out of memory' "$out/errors" || fail "no 'out of memory' in the error"
grep -q 'cannot allocate' "$out/errors" || fail "no 'cannot allocate' in the error"
[[ ! -e "$out/m.pt" && ! -e "$out/r.json" ]] || fail "left an output"
if [[ -e "$out/m.pt.run" ]]; then
  [[ -e "$out/m.pt.run/state.pt" ]] ||
    fail "left a run directory without a checkpoint: $(ls -A "$out/m.pt.run")"
  grep -q -- '--resume' "$out/errors" || fail "a checkpoint but no --resume hint"
  if [[ -n "$(ls -A "$out/m.pt.run/spill" 2>/dev/null)" ]]; then
    fail "spill files left: $(ls "$out/m.pt.run/spill")"
  fi
fi
leftovers=$(ls -A "$out" | grep -v -x -e log -e errors -e m.pt.run || true)
[[ -z "$leftovers" ]] || fail "files left in the output directory: $leftovers"
[[ -z "$(ls -A "$TMPDIR")" ]] || fail "files left in TMPDIR: $(ls -A "$TMPDIR")"
echo "PASS"
