#!/usr/bin/env bash
# Tests tools/prune_disk_cache.sh on a cache of its own: under the size
# bound nothing goes; over it, only entries unread for more than the given
# days go.
set -euo pipefail
script=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/prune_disk_cache.sh
tmp=${TEST_TMPDIR:-$(mktemp -d)}
cache=$tmp/cache
mkdir -p "$cache/ac" "$cache/cas"
head -c 2097152 /dev/zero >"$cache/cas/old"
head -c 2097152 /dev/zero >"$cache/cas/new"
echo entry >"$cache/ac/old"
touch -a -d "10 days ago" "$cache/cas/old" "$cache/ac/old"
failures=0
check() { # NAME CONDITION...
  local name=$1
  shift
  if ! "$@"; then
    echo "FAIL [$name]"
    failures=$((failures + 1))
  fi
}
# 4 MiB is under a 1 GiB bound: kept.
TRACECUT_DISK_CACHE_MAX_GB=1 bash "$script" "$cache" >/dev/null
check "under the bound, old kept" test -f "$cache/cas/old"
# Over a 0 GiB bound: what was unread for more than 3 days goes.
out=$(TRACECUT_DISK_CACHE_MAX_GB=0 bash "$script" "$cache")
check "over the bound, old removed" test ! -e "$cache/cas/old"
check "over the bound, old ac removed" test ! -e "$cache/ac/old"
check "over the bound, new kept" test -f "$cache/cas/new"
check "says what it did" grep -q "removed 2 entries" <<<"$out"
# A missing cache is no error.
check "missing cache" bash "$script" "$tmp/none"
if ((failures > 0)); then exit 1; fi
echo "PASS"
