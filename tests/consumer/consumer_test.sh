#!/usr/bin/env bash
# //tests/consumer:consumer_test: builds examples/consumer, a separate Bazel
# workspace that depends on this one as @tracecut (docs/consuming.md), the
# way another team would, and checks what Bazel's caching promises:
#
#   1. `bazel test //...` in the consumer from a clean output base, offline
#      (test results not taken from the disk cache): tracecut's libraries
#      and CLI, the tracecut_* rules over a tiny Llama (trace, partition
#      with its SVG drawing, calibrate), the consumer's own modifier in a
#      calibrate binary and in a program, and the consumer's tests;
#   2. after restarting the server, `bazel build //...` runs no action;
#   3. after a change to the model's input (its seed), `bazel build //...`
#      re-runs exactly the actions that depend on it (rerun_check.py; an
#      action whose inputs came out byte-identical must not run);
#   4. `bazel test //...` passes on the changed model.
#
# Compiles come from the disk cache ~/.cache/tracecut-bazel-disk of the
# account running the test (Bazel runs tests without the caller's HOME, so
# it is looked up in the password database; TRACECUT_DISK_CACHE overrides
# it, "none" turns it off). It reads the source tree itself, so it runs
# unsandboxed (tag "local") and is never cached (tag "external").
set -euo pipefail

log() { printf 'consumer_test: %s\n' "$*"; }
fail() {
  printf 'consumer_test: FAIL: %s\n' "$*" >&2
  exit 1
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---------------------------------------------------------------- setup

self=$(readlink -f "${BASH_SOURCE[0]}")
root=${self%/tests/consumer/consumer_test.sh}
if [[ $root == "$self" || ! -f $root/WORKSPACE || ! -f $root/examples/consumer/WORKSPACE ]]; then
  fail "cannot find the source tree from '$self'; the test must run unsandboxed (tags = [\"local\"])"
fi
checker=$root/tests/consumer/rerun_check.py

tmp=${TEST_TMPDIR:-$(mktemp -d)}
home=$(getent passwd "$(id -u)" | cut -d: -f6)
disk_cache=${TRACECUT_DISK_CACHE:-$home/.cache/tracecut-bazel-disk}

# A snapshot of the source tree as @tracecut (it must not change between
# the builds compared below, whatever happens in the checkout meanwhile),
# and a copy of the consumer workspace (the test edits its model input).
src=$tmp/tracecut
work=$tmp/consumer
rm -rf "$src" "$work"
mkdir -p "$src" "$work"
tar -C "$root" --exclude=./.git --exclude='./bazel-*' --exclude=./user.bazelrc \
  --exclude=./examples/consumer -cf - . | tar -C "$src" -xf -
tar -C "$root/examples/consumer" --exclude='./bazel-*' --exclude=./user.bazelrc -cf - . |
  tar -C "$work" -xf -
{
  echo "build --override_repository=tracecut=$src"
  if [[ $disk_cache != none ]]; then
    echo "build --disk_cache=$disk_cache"
  else
    echo "build --disk_cache="
  fi
  echo "build --color=no --curses=no --show_progress_rate_limit=60"
} >"$work/user.bazelrc"
# Offline: a download would go through this proxy, which is not there.
export HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9
export http_proxy=$HTTP_PROXY https_proxy=$HTTPS_PROXY
cd "$work"

ob=$tmp/output_base
bz() {
  bazel --output_user_root="$tmp/user_root" --output_base="$ob" \
    --max_idle_secs=900 "$@"
}
trap 'bz shutdown >/dev/null 2>&1 || true' EXIT

log "tracecut source tree: $root (snapshot in $src)"
log "disk cache: $disk_cache"
log "consumer copy: $work, output base: $ob (clean)"

# The "INFO: N processes: ..." line of a build (empty when there is none).
processes_line() { grep -E '^INFO: [0-9]+ process(es)?[:.]' "$1" | tail -1 || true; }

# ---------------------------------------------------------------- 1. cold

log "1. bazel test //... from a clean output base"
t=$(now)
if ! bz test --nocache_test_results //... >"$tmp/build1.log" 2>&1; then
  cat "$tmp/build1.log"
  fail "bazel test //... failed in the consumer workspace"
fi
t_cold=$(elapsed "$t")
grep -E '^//' "$tmp/build1.log" | sed 's/^/    /' || true
log "   $(processes_line "$tmp/build1.log")"
log "   ${t_cold}s"

# The rules' outputs are there and look like what they claim to be.
bin=$(bz info bazel-bin 2>/dev/null)
for f in tiny_llama_ir.ir.txt tiny_llama_ir.summary.json; do
  [[ -s $bin/$f ]] || fail "missing output $f"
done
grep -q '^graph {' "$bin/tiny_llama_ir.ir.txt" || fail "tiny_llama_ir.ir.txt is not IR text"

# ---------------------------------------------------------------- 2. no-op

log "2. bazel build //... again, after a server restart: no action may run"
bz shutdown
t=$(now)
bz build //... --execution_log_json_file="$tmp/exec2.json" >"$tmp/build2.log" 2>&1 ||
  {
    cat "$tmp/build2.log"
    fail "second build failed"
  }
t_noop=$(elapsed "$t")
python3 "$checker" count "$tmp/exec2.json" >"$tmp/spawns2.txt"
spawns=$(head -1 "$tmp/spawns2.txt")
log "   $(processes_line "$tmp/build2.log"); ${spawns} spawns in the execution log; ${t_noop}s"
if [[ $spawns != 0 ]]; then
  tail -n +2 "$tmp/spawns2.txt" | sed 's/^/    ran: /'
  fail "a build with no change ran $spawns actions"
fi

# ---------------------------------------------------------------- 3. change

log "3. change the model input (model/tiny_llama.flags: another seed)"
bz aquery --output=jsonproto 'deps(//...)' >"$tmp/aquery.json" 2>"$tmp/aquery.log" ||
  {
    cat "$tmp/aquery.log"
    fail "aquery failed"
  }
execroot=$(bz info execution_root 2>/dev/null)
python3 "$checker" snapshot "$tmp/aquery.json" "$execroot" model/tiny_llama.flags >"$tmp/before.json"
grep -q -- '--seed=1' model/tiny_llama.flags || fail "model/tiny_llama.flags has no --seed=1"
sed -i 's/--seed=1/--seed=7/' model/tiny_llama.flags
t=$(now)
bz build //... --execution_log_json_file="$tmp/exec3.json" >"$tmp/build3.log" 2>&1 ||
  {
    cat "$tmp/build3.log"
    fail "build after the change failed"
  }
t_change=$(elapsed "$t")
log "   $(processes_line "$tmp/build3.log"); ${t_change}s"
rc=0
python3 "$checker" check "$tmp/aquery.json" "$tmp/before.json" "$tmp/exec3.json" \
  model/tiny_llama.flags >"$tmp/rerun.txt" || rc=$?
sed 's/^/    /' "$tmp/rerun.txt"
((rc == 0)) || fail "the change did not re-run exactly the actions that depend on it"

# ---------------------------------------------------------------- 4. tests

log "4. bazel test //... on the changed model"
t=$(now)
if ! bz test --nocache_test_results //... >"$tmp/build4.log" 2>&1; then
  cat "$tmp/build4.log"
  fail "the consumer's tests failed on the changed model"
fi
t_retest=$(elapsed "$t")
log "   ${t_retest}s"

log "times: cold ${t_cold}s, no-op ${t_noop}s, model change ${t_change}s, re-test ${t_retest}s"
log "PASS"
