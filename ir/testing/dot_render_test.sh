#!/usr/bin/env bash
# Renders ToDot() output of every varied test graph with Graphviz, so that
# escaping mistakes show up as syntax errors. Graphviz is part of the
# bootstrap (tools/bootstrap.sh); without it the test fails and says so.
#
#   dot_render_test.sh PATH/TO/dot_samples
set -euo pipefail

samples=$1
if ! command -v dot >/dev/null; then
  echo "FAIL: Graphviz 'dot' is not installed (run tools/bootstrap.sh)" >&2
  exit 1
fi
tmp=${TEST_TMPDIR:-$(mktemp -d)}
out=$tmp/dot_samples
# Fontconfig wants a writable cache; the test sandbox has no home.
export XDG_CACHE_HOME=$tmp/cache HOME=$tmp
mkdir -p "$out"
"$samples" "$out"
count=0
for f in "$out"/*.dot; do
  # Graphviz warns (and still exits 0) on some malformed input: treat any
  # message as a failure.
  if ! dot -Tsvg "$f" -o "${f%.dot}.svg" 2>"$f.err" || [[ -s $f.err ]]; then
    echo "FAIL: dot -Tsvg $(basename "$f"):" >&2
    cat "$f.err" >&2
    exit 1
  fi
  grep -q '<svg' "${f%.dot}.svg"
  count=$((count + 1))
done
if ((count == 0)); then
  echo "FAIL: dot_samples wrote no files" >&2
  exit 1
fi
echo "rendered $count DOT files"
