#!/usr/bin/env bash
# Dependencies point down the layers of DESIGN.md ("Layers and packages"):
# every #include "<pkg>/..." in a source file and every "//<pkg>" label in a
# BUILD file must name the file's own top-level package or one below it.
#
#   layering_test.sh FILE...   (each package's :layering_sources)
#
# Also: util/ and ir/ include no LibTorch header, and no file includes
# another package's *_internal.h.
#
# Test code (a *_test.cc/_fuzzer.cc file, anything under a testing/ folder, a
# test or testonly rule in BUILD) may in addition use the front end (tracer/)
# to load real models, the generated models of tests/fixtures and the
# `tracecut` binary (end-to-end tests beside the code they check); nothing
# else above. Visibility labels (__pkg__, __subpackages__) are not uses.
set -euo pipefail

# What each package may use besides itself. Kept transitively closed, so
# checking direct dependencies checks all of them.
declare -A allowed=(
  [util]=""
  [ir]="util"
  [runtime]="util ir"
  [checkpoint]="util"
  [tracer]="util ir runtime checkpoint"
  [partition]="util ir runtime"
  [quantization]="util ir runtime"
  [transforms]="util ir runtime partition"
  [modifiers]="util ir runtime checkpoint partition quantization"
  [output]="util ir runtime checkpoint partition quantization modifiers"
  [pipelines]="util ir runtime checkpoint tracer partition transforms quantization modifiers output"
  [tools]="util ir runtime checkpoint tracer partition transforms quantization modifiers output pipelines python"
)
# The top: may use everything.
top="tests bench docs examples"
test_extra="tracer tests tools"
# Single uses above, each with its reason.
declare -A exceptions=(
  # The demo ships the small generated Llama of tests/fixtures.
  ["tools/BUILD //tests/fixtures:llama.pt"]=1
)
packages="util ir runtime checkpoint tracer partition transforms quantization modifiers output pipelines tools python tests bench docs examples third_party"

status=0
fail() {
  echo "FAIL: $*" >&2
  status=1
}

is_package() { [[ " $packages " == *" $1 "* ]]; }

# may_use FROM TO IS_TEST
may_use() {
  local from=$1 to=$2 is_test=$3
  [[ $from == "$to" || $to == third_party ]] && return 0
  [[ " $top " == *" $from "* ]] && return 0
  [[ " ${allowed[$from]:-} " == *" $to "* ]] && return 0
  [[ $is_test == 1 && " $test_extra " == *" $to "* ]] && return 0
  return 1
}

declare -A seen=()
sources=0
builds=0
for f in "$@"; do
  pkg=${f%%/*}
  if ! is_package "$pkg"; then
    fail "$f: not in a known package (add it to this test)"
    continue
  fi
  seen[$pkg]=1
  base=${f##*/}
  if [[ $base == BUILD ]]; then
    builds=$((builds + 1))
    # rule kind per line: a rule starts at column 0 with "kind(".
    while IFS=$'\t' read -r line kind testonly label; do
      [[ $label == *:__pkg__ || $label == *:__subpackages__ ]] && continue
      [[ -n ${exceptions["$f $label"]:-} ]] && continue
      to=${label#//}
      to=${to%%[:/]*}
      is_package "$to" || continue
      is_test=0
      [[ $kind == *_test || $kind == *test_suite || $testonly == 1 ]] && is_test=1
      may_use "$pkg" "$to" "$is_test" ||
        fail "$f:$line: $kind rule uses $label (package '$to' is above '$pkg')"
    done < <(awk '
      /^[a-z_]+\(/ { kind = $0; sub(/\(.*/, "", kind); testonly = 0 }
      /^    testonly = (True|1)/ { testonly = 1 }
      { s = $0
        while (match(s, /"(@tracecut)?\/\/[a-z_]+[^"]*"/)) {
          label = substr(s, RSTART + 1, RLENGTH - 2)
          sub(/^@tracecut/, "", label)
          printf "%d\t%s\t%d\t%s\n", NR, kind, testonly, label
          s = substr(s, RSTART + RLENGTH)
        } }' "$f")
    continue
  fi
  sources=$((sources + 1))
  is_test=0
  [[ $base == *_test.cc || $base == *_fuzzer.cc || $f == */testing/* ]] && is_test=1
  while IFS=: read -r line inc; do
    to=${inc%%/*}
    if [[ $inc == *_internal.h && $to != "$pkg" ]]; then
      fail "$f:$line: includes $inc, internal to package '$to'"
    fi
    is_package "$to" || continue
    may_use "$pkg" "$to" "$is_test" ||
      fail "$f:$line: includes $inc (package '$to' is above '$pkg')"
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' "$f" |
    sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/')
  if [[ $pkg == util || $pkg == ir ]] &&
    grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](torch|ATen|c10|caffe2)/' "$f"; then
    fail "$f: $pkg/ must not include LibTorch"
  fi
done

# The check is vacuous unless it saw every layered package.
for p in util ir runtime checkpoint tracer partition transforms quantization modifiers output pipelines tools; do
  [[ -n ${seen[$p]:-} ]] || fail "no files of package '$p' were given"
done

if ((status == 0)); then
  echo "layering holds: $sources sources and $builds BUILD files in ${#seen[@]} packages"
fi
exit $status
