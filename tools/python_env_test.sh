#!/usr/bin/env bash
# Tests tools/python_env.sh and tools/python on a copy of the scripts with a
# lock file of its own: the environment's path follows the lock's content,
# a complete environment is found under the account's home when HOME points
# elsewhere (as under bazel test), TRACECUT_PYTHON_ENV overrides, and
# tools/python refuses an environment without the completion marker.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=${TEST_TMPDIR:-$(mktemp -d)}
tree=$tmp/tree
mkdir -p "$tree/tools" "$tree/third_party/python"
cp "$src/python_env.sh" "$src/python" "$tree/tools/"
lock=$tree/third_party/python/requirements.lock
echo "torch==1.0 --hash=sha256:aa" >"$lock"
failures=0
check() { # NAME ACTUAL EXPECTED
  if [[ $2 != "$3" ]]; then
    echo "FAIL [$1]: got '$2', want '$3'"
    failures=$((failures + 1))
  fi
}
env_dir() { env -u TRACECUT_PYTHON_ENV -u XDG_CACHE_HOME "$@" bash "$tree/tools/python_env.sh"; }

first=$(env_dir HOME="$tmp/home")
check "under HOME" "${first%/tracecut/*}" "$tmp/home/.cache"
check "deterministic" "$(env_dir HOME="$tmp/home")" "$first"
echo "torch==2.0 --hash=sha256:bb" >"$lock"
second=$(env_dir HOME="$tmp/home")
if [[ $second == "$first" ]]; then
  echo "FAIL [lock change]: the path did not change with the lock ($first)"
  failures=$((failures + 1))
fi
check "XDG_CACHE_HOME" "$(env_dir HOME="$tmp/home" XDG_CACHE_HOME="$tmp/xdg")" \
  "$tmp/xdg/${second#"$tmp/home/.cache/"}"
check "override" "$(TRACECUT_PYTHON_ENV=/x/y bash "$tree/tools/python_env.sh")" /x/y

# A complete environment under XDG_CACHE_HOME wins over an empty HOME.
name=${second#"$tmp/home/.cache/"}
mkdir -p "$tmp/xdg/$name/bin"
touch "$tmp/xdg/$name/.tracecut-complete"
check "complete one found" "$(env_dir HOME="$tmp/elsewhere" XDG_CACHE_HOME="$tmp/xdg")" "$tmp/xdg/$name"

# tools/python runs bin/python of a complete environment, and refuses an
# incomplete one (exit 127, one line naming the bootstrap).
printf '#!/bin/sh\necho fake-python "$@"\n' >"$tmp/xdg/$name/bin/python"
chmod +x "$tmp/xdg/$name/bin/python"
check "runs it" "$(TRACECUT_PYTHON_ENV="$tmp/xdg/$name" "$tree/tools/python" -c 1)" "fake-python -c 1"
rm "$tmp/xdg/$name/.tracecut-complete"
rc=0
msg=$(TRACECUT_PYTHON_ENV="$tmp/xdg/$name" "$tree/tools/python" -c 1 2>&1) || rc=$?
check "incomplete: exit" "$rc" 127
if [[ $msg != *"run tools/bootstrap.sh"* ]]; then
  echo "FAIL [incomplete: message]: $msg"
  failures=$((failures + 1))
fi

if ((failures)); then exit 1; fi
echo "python_env_test: ok"
