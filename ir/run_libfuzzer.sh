#!/usr/bin/env bash
# Builds an ir/ fuzz target with clang's libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer (straight from the sources, outside Bazel, so
# .bazelrc needs no fuzzing config) and runs it over its seed corpus.
#
#   ir/run_libfuzzer.sh                         # text_fuzzer, -runs=20000
#   ir/run_libfuzzer.sh -max_total_time=300     # any libFuzzer flags
#   FUZZ_TARGET=proto ir/run_libfuzzer.sh       # proto_fuzzer instead
#   bazel test //ir:text_libfuzzer_test         # text, -runs=20000
#
# Needs clang++ and libclang-rt-14-dev (libFuzzer runtime) and the system
# Abseil, all from tools/bootstrap.sh. New corpus entries and crash inputs go
# to $FUZZ_OUT (default: a fresh temp directory, printed at the end); turn a
# crash into a seed under ir/testdata/text_corpus/ and a text_test case.
set -euo pipefail

if [[ -n ${TEST_SRCDIR:-} ]]; then
  root=$TEST_SRCDIR/${TEST_WORKSPACE:-tracecut}
else
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
fi
out=${FUZZ_OUT:-$(mktemp -d "${TEST_TMPDIR:-/tmp}/text_fuzzer.XXXXXX")}
mkdir -p "$out/corpus" "$out/artifacts"
cxx=${CXX_FOR_FUZZING:-clang++}
absl_dir=${ABSL_LIBDIR:-/usr/lib/x86_64-linux-gnu}

if ! command -v "$cxx" >/dev/null; then
  echo "run_libfuzzer: $cxx not found (run tools/bootstrap.sh)" >&2
  exit 1
fi
# Link every Abseil library, keeping only those the code needs (as the
# Bazel glue in third_party/system_libs.bzl does).
absl_libs=()
for lib in "$absl_dir"/libabsl_*.so; do
  name=${lib##*/lib}
  absl_libs+=("-l${name%.so}")
done

target=${FUZZ_TARGET:-text}
sources=("$root/ir/graph.cc" "$root/ir/names.cc" "$root/ir/verifier.cc"
  "$root/ir/text_parser.cc" "$root/ir/text_printer.cc"
  "$root/ir/text_scanner.cc")
extra=()
case $target in
  text)
    dict=(-dict="$root/ir/testdata/text.dict")
    seeds=$root/ir/testdata/text_corpus
    ;;
  proto)
    # Generate graph.pb.{h,cc} as cc_proto_library would.
    mkdir -p "$out/gen"
    protoc --cpp_out="$out/gen" -I"$root" "$root/ir/graph.proto"
    sources+=("$root/ir/proto.cc" "$out/gen/ir/graph.pb.cc")
    extra=(-I"$out/gen" -lprotobuf)
    dict=()
    seeds=$root/ir/testdata/proto_corpus
    ;;
  *)
    echo "run_libfuzzer: FUZZ_TARGET must be text or proto" >&2
    exit 1
    ;;
esac

start=$SECONDS
"$cxx" -std=c++20 -g -O1 -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$root" "${sources[@]}" "$root/ir/${target}_fuzzer.cc" \
  -o "$out/${target}_fuzzer" \
  -L"$absl_dir" -Wl,--as-needed "${absl_libs[@]}" "${extra[@]}"
echo "run_libfuzzer: built ${target}_fuzzer in $((SECONDS - start)) s"

args=("$@")
if ((${#args[@]} == 0)); then args=(-runs=20000); fi

start=$SECONDS
# The first corpus directory receives new inputs; the seeds stay untouched.
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ASAN_OPTIONS=detect_leaks=1 \
  "$out/${target}_fuzzer" "${dict[@]}" \
  -artifact_prefix="$out/artifacts/" \
  -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  "${args[@]}" \
  "$out/corpus" "$seeds"
echo "run_libfuzzer: fuzzed for $((SECONDS - start)) s; corpus and" \
  "artifacts in $out"
