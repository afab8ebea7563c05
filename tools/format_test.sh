#!/usr/bin/env bash
# //tools:format_test: fails when files in the source tree are not formatted
# (tools/format.sh --check). It finds the source tree by resolving the
# runfiles link to tools/format.sh, so it must run unsandboxed (tag "local").
set -euo pipefail

rel="${TEST_WORKSPACE:-tracecut}/tools/format.sh"
script=""
if [[ -n ${TEST_SRCDIR:-} && -e $TEST_SRCDIR/$rel ]]; then
  script="$TEST_SRCDIR/$rel"
elif [[ -n ${RUNFILES_MANIFEST_FILE:-} ]]; then
  script=$(grep -m1 "^$rel " "$RUNFILES_MANIFEST_FILE" | cut -d' ' -f2-)
fi
real=$(readlink -f "$script" 2>/dev/null || true)
root=${real%/tools/format.sh}
if [[ -z $real || $root == "$real" || ! -f $root/WORKSPACE ]]; then
  echo "format_test: cannot find the source tree from runfile '$script'" \
    "(resolved to '$real'); the test must run unsandboxed (tags = [\"local\"])" >&2
  exit 2
fi

# Bazel runs tests without the caller's HOME; tools/buildifier.sh falls back
# to the passwd home directory. When the output base is under the default
# ~/.cache/bazel, that ~ is the caller's home: prefer its buildifier install.
if [[ -z ${TRACECUT_TOOLS_DIR:-} && ${TEST_SRCDIR:-} == */.cache/bazel/_bazel_* ]]; then
  caller_home=${TEST_SRCDIR%%/.cache/bazel/_bazel_*}
  if [[ -d $caller_home/.cache/tracecut-tools ]]; then
    export TRACECUT_TOOLS_DIR=$caller_home/.cache/tracecut-tools
  fi
fi

echo "format_test: checking $root"
rc=0
bash "$root/tools/format.sh" --check || rc=$?
case $rc in
  0) echo "format_test: all files formatted" ;;
  1) echo "format_test: run tools/format.sh to fix" ;;
  *) echo "format_test: could not check formatting (see above; tools/bootstrap.sh installs clang-format and buildifier)" ;;
esac
exit "$rc"
