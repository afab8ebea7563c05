# Shared by the CLI tests (sourced): paths, counters, fail and expect_error.
#
# expect_error NAME MENTION OUTDIR OUTFILE -- ARGS...
#   Runs `tracecut ARGS` and checks the contract: exit status in 1..127 (an
#   error, not a signal), exactly one non-empty stderr line that contains
#   MENTION (the offending file or flag), OUTFILE (if given) absent
#   afterwards, and OUTDIR (if it exists) holding exactly what it held
#   before (no partial or temporary files).
# Environment knobs, for one call (VAR=... expect_error ...):
#   FILE_LIMIT_KB=N  run under `ulimit -f N` with SIGXFSZ ignored, so writes
#                    past N KiB fail with EFBIG (a full disk, for one
#                    process)
#   ALLOW_PROGRESS=1 ignore calibrate's "[tracecut] ..." progress lines (off a
#                    terminal they are plain log lines, printed before a
#                    failure that happens mid-run); the rest must still be
#                    exactly one line
#   ALSO_EMPTY=DIR   DIR must be empty afterwards (e.g. a spill directory)
#   STDOUT_TO=FILE   where stdout goes (default /dev/null)
#   MEMORY_LIMIT_KB=N  run under `ulimit -v N` (a memory bound the case
#                    must stay under: an allocation past it fails)
#   TIMEOUT_S=N      stop the run after N seconds (default 600); a run that
#                    times out (a read blocked on a FIFO) fails the case
#   TRACE_OPENS=FILE run under `strace -f -e trace=open,openat`, writing the
#                    files opened to FILE (check them with expect_not_opened)

RUNFILES="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-tracecut}"
TRACECUT="$RUNFILES/tools/tracecut"
FIXTURES="$RUNFILES/tests/fixtures"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
MODEL="$FIXTURES/llama.pt"
# The project's Python (@libtorch//:python, set by the BUILD rule).
PYTHON="${TRACECUT_PYTHON:-python3}"

failures=0
cases=0

fail() {
  echo "FAIL [$1]: $2"
  failures=$((failures + 1))
}

run_tracecut() {
  (
    if [ -n "${FILE_LIMIT_KB:-}" ]; then
      trap '' XFSZ
      ulimit -f "$FILE_LIMIT_KB"
    fi
    if [ -n "${MEMORY_LIMIT_KB:-}" ]; then ulimit -v "$MEMORY_LIMIT_KB"; fi
    if [ -n "${TRACE_OPENS:-}" ]; then
      exec timeout -k 5 "${TIMEOUT_S:-600}" strace -f -qq \
        -e trace=open,openat,openat2 -o "$TRACE_OPENS" "$TRACECUT" "$@"
    fi
    exec timeout -k 5 "${TIMEOUT_S:-600}" "$TRACECUT" "$@"
  )
}

expect_error() {
  local name="$1" mention="$2" outdir="$3" outfile="$4"
  shift 5
  cases=$((cases + 1))
  local failures_before=$failures
  local before=""
  [ -d "$outdir" ] && before="$(ls -A "$outdir")"
  local raw="$TMP/stderr_raw.txt" err="$TMP/stderr.txt"
  run_tracecut "$@" >"${STDOUT_TO:-/dev/null}" 2>"$raw"
  local rc=$?
  if [ "${ALLOW_PROGRESS:-0}" = 1 ]; then
    grep -v '^\[tracecut\] ' "$raw" >"$err"
  else
    cp "$raw" "$err"
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "$name" "timed out after ${TIMEOUT_S:-600} s: tracecut $*"
  elif [ "$rc" -eq 0 ]; then
    fail "$name" "exit 0 (expected an error): tracecut $*"
  elif [ "$rc" -ge 128 ]; then
    fail "$name" "killed by a signal (exit $rc): tracecut $*; stderr: $(head -c 500 "$raw")"
  fi
  local lines
  lines=$(grep -c '' "$err")
  if [ ! -s "$err" ]; then
    fail "$name" "empty stderr: tracecut $*"
  elif [ "$lines" -ne 1 ]; then
    fail "$name" "stderr has $lines lines, expected 1: tracecut $*"
    sed 's/^/    | /' "$err" | head -20
  elif ! grep -qF -- "$mention" "$err"; then
    fail "$name" "stderr does not mention '$mention': $(cat "$err")"
  fi
  if [ -n "$outfile" ] && [ -e "$outfile" ]; then
    fail "$name" "left an output file $outfile"
  fi
  if [ -d "$outdir" ]; then
    local after
    after="$(ls -A "$outdir")"
    if [ "$before" != "$after" ]; then
      fail "$name" "stray files in $outdir: $(echo "$after" | tr '\n' ' ')"
    fi
  fi
  if [ -n "${ALSO_EMPTY:-}" ] && [ -d "$ALSO_EMPTY" ] &&
    [ -n "$(ls -A "$ALSO_EMPTY")" ]; then
    fail "$name" "left files in $ALSO_EMPTY: $(ls -A "$ALSO_EMPTY" | tr '\n' ' ')"
  fi
  if [ "$failures" -eq "$failures_before" ]; then
    echo "ok [$name] exit $rc: $(head -1 "$err")"
  fi
}

# expect_not_opened NAME TRACE PATH...: none of PATH appears among the files
# the traced run opened (TRACE_OPENS's file).
expect_not_opened() {
  local name="$1" trace="$2"
  shift 2
  cases=$((cases + 1))
  if [ ! -s "$trace" ]; then
    fail "$name" "no strace output in $trace"
    return
  fi
  local p
  for p in "$@"; do
    if grep -F -- "\"$p\"" "$trace" | grep -v ENOENT >/dev/null; then
      fail "$name" "opened $p: $(grep -F -- "\"$p\"" "$trace" | head -2)"
      return
    fi
  done
  echo "ok [$name] did not open: $*"
}
