#!/usr/bin/env bash
# Keeps Bazel's disk cache (.bazelrc: --disk_cache=~/.cache/tracecut-bazel-disk)
# bounded. Bazel 4.2 never deletes from it, and every tree's actions add to
# it: it reached 49 GB here and a CI run failed with "No space left on
# device". When the cache is over TRACECUT_DISK_CACHE_MAX_GB (default 20),
# entries nobody has read for TRACECUT_DISK_CACHE_DAYS days (default 3; the
# file system's atime, which relatime still updates once a day) are
# deleted. A deleted entry is only a cache miss: Bazel rebuilds it.
#
#   tools/prune_disk_cache.sh [CACHE_DIR]
set -euo pipefail
dir=${1:-${TRACECUT_DISK_CACHE:-$HOME/.cache/tracecut-bazel-disk}}
max_gb=${TRACECUT_DISK_CACHE_MAX_GB:-20}
days=${TRACECUT_DISK_CACHE_DAYS:-3}
if [[ ! -d $dir ]]; then exit 0; fi
size_kb=$(du -sk "$dir" | cut -f1)
if ((size_kb <= max_gb * 1024 * 1024)); then exit 0; fi
removed=$(find "$dir" -type f -atime "+$days" -print -delete | wc -l)
after_kb=$(du -sk "$dir" | cut -f1)
echo "prune_disk_cache: $dir was $((size_kb / 1024)) MiB (over $max_gb GiB);" \
  "removed $removed entries unread for more than $days days;" \
  "now $((after_kb / 1024)) MiB"
