#!/usr/bin/env bash
# layering_test.sh must fail on each kind of violation it claims to catch,
# and pass a tree that keeps the layers.
#
#   layering_selftest.sh PATH_TO_layering_test.sh
set -euo pipefail
checker=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

good() {
  rm -rf ./*
  for p in util ir runtime checkpoint tracer partition transforms quantization modifiers output pipelines tools; do
    mkdir -p "$p"
    printf '#include "util/status_macros.h"\n' >"$p/a.cc"
    printf 'cc_library(\n    name = "a",\n    deps = ["//util:status_macros"],\n)\n' >"$p/BUILD"
  done
  printf '#include "tracer/load.h"\n' >partition/a_test.cc
  printf '#include "transforms/per_subgraph_internal.h"\n' >transforms/b.cc
}
files() { find . -type f -printf '%P\n' | sort; }

status=0
# expect_failure DESCRIPTION MESSAGE_REGEX
expect_failure() {
  local out
  if out=$(bash "$checker" $(files) 2>&1); then
    echo "FAIL: $1: the checker passed" >&2
    status=1
  elif ! grep -qE "$2" <<<"$out"; then
    echo "FAIL: $1: expected /$2/ in:" >&2
    echo "$out" >&2
    status=1
  fi
}

good
if ! out=$(bash "$checker" $(files) 2>&1); then
  echo "FAIL: a layered tree was refused:" >&2
  echo "$out" >&2
  status=1
fi

good
printf '#include "pipelines/pipeline.h"\n' >>runtime/a.cc
expect_failure "include from above" "runtime/a.cc:2: includes pipelines/pipeline.h \(package 'pipelines' is above 'runtime'\)"

good
printf '#include "tracer/load.h"\n' >partition/a.cc
expect_failure "test-only allowance used by library code" "partition/a.cc:1: includes tracer/load.h"

good
printf 'cc_library(\n    name = "b",\n    deps = ["//transforms:pass_pipeline"],\n)\n' >>partition/BUILD
expect_failure "BUILD dependency on a package above" "partition/BUILD:7: cc_library rule uses //transforms:pass_pipeline"

good
printf '#include "transforms/per_subgraph_internal.h"\n' >tools/b.cc
expect_failure "another package's internal header" "tools/b.cc:1: includes transforms/per_subgraph_internal.h, internal"

good
printf '#include <torch/torch.h>\n' >ir/b.cc
expect_failure "LibTorch in ir/" "ir/ must not include LibTorch"

good
rm -r checkpoint
expect_failure "a package missing from the input" "no files of package 'checkpoint'"

((status == 0)) && echo "layering_test.sh catches every violation tried"
exit $status
