#!/usr/bin/env bash
# ir/ sits at the bottom of the layering (see DESIGN.md): it must not depend
# on LibTorch, nor include a header from LibTorch or from a package above.
#
#   layering_test.sh DEPS_QUERY_OUTPUT SOURCE...
#
# DEPS_QUERY_OUTPUT is the genquery of deps(//ir:all-libraries).
set -euo pipefail

deps=$1
shift
status=0

# The query must have seen the libraries, or the check below is vacuous.
if ! grep -qx '//ir:ir' "$deps" || ! grep -qx '//ir:text' "$deps"; then
  echo "FAIL: $deps does not list //ir:ir and //ir:text:" >&2
  cat "$deps" >&2
  exit 1
fi

if grep -n '@libtorch' "$deps"; then
  echo "FAIL: //ir libraries depend on LibTorch (above)" >&2
  status=1
fi

if grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](torch|ATen|c10|caffe2)/' "$@"; then
  echo "FAIL: ir/ includes LibTorch headers (above)" >&2
  status=1
fi

if grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"(runtime|tracer|partition|transforms|pipelines|tools|tests|bench)/' "$@"; then
  echo "FAIL: ir/ includes headers from packages above it (above)" >&2
  status=1
fi

if ((status == 0)); then
  echo "ir/ is free of LibTorch: $(wc -l <"$deps") deps, $# sources checked"
fi
exit $status
