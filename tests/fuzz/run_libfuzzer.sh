#!/usr/bin/env bash
# Builds a tests/fuzz target with clang's libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer (from the sources, outside Bazel, as
# ir/run_libfuzzer.sh does) and runs it over its seed corpus.
#
#   tests/fuzz/run_libfuzzer.sh                           # plan, -runs=20000
#   FUZZ_TARGET=recipe tests/fuzz/run_libfuzzer.sh -max_total_time=300
#
# Targets: plan (partition/plan.h), recipe (pipelines/recipe.h; links the
# system LibTorch for c10::Device, uninstrumented), safetensors (the
# safetensors header and an index's file names, checkpoint/) and inputs_json
# (tracecut_inputs.json; LibTorch as for recipe). The last two take their
# seeds from FUZZ_SEEDS=bazel-bin/tests/fuzz/hostile_corpus/<safetensors|inputs>. The model loader target
# is not built here: LoadModel is mostly LibTorch, which is not instrumented,
# so coverage feedback would see little; use its smoke test with more
# --iterations instead. Needs clang++, libclang-rt-14-dev, protoc and the
# system Abseil and Protobuf. New corpus entries and crash inputs go to
# $FUZZ_OUT (default: a fresh temp directory, printed at the end); turn a
# crash into a seed under tests/fuzz/testdata/<target>_corpus/.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
target=${FUZZ_TARGET:-plan}
out=${FUZZ_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/${target}_fuzzer.XXXXXX")}
mkdir -p "$out/corpus" "$out/artifacts" "$out/gen"
cxx=${CXX_FOR_FUZZING:-clang++}
absl_dir=${ABSL_LIBDIR:-/usr/lib/x86_64-linux-gnu}
torch_home=${LIBTORCH_HOME:-/usr}

if ! command -v "$cxx" >/dev/null; then
  echo "run_libfuzzer: $cxx not found (run tools/bootstrap.sh)" >&2
  exit 1
fi
absl_libs=()
for lib in "$absl_dir"/libabsl_*.so; do
  name=${lib##*/lib}
  absl_libs+=("-l${name%.so}")
done

case $target in
  plan)
    protoc --cpp_out="$out/gen" -I"$root" "$root/partition/plan.proto"
    sources=("$root/partition/plan.cc" "$root/partition/partitioner.cc"
      "$root/partition/subgraph.cc" "$root/ir/graph.cc" "$root/ir/verifier.cc"
      "$root/ir/dot.cc" "$out/gen/partition/plan.pb.cc")
    extra=()
    ;;
  recipe)
    protoc --cpp_out="$out/gen" -I"$root" "$root/pipelines/recipe.proto"
    sources=("$root/pipelines/recipe.cc" "$out/gen/pipelines/recipe.pb.cc")
    # LibTorch ships without exported RTTI for some types: no vptr checks.
    extra=(-fno-sanitize=vptr -I"$torch_home/include"
      -I"$torch_home/include/torch/csrc/api/include"
      -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10 -Wl,--as-needed)
    ;;
  safetensors)
    sources=("$root/checkpoint/safetensors_header.cc"
      "$root/checkpoint/closed_dir.cc" "$root/util/path_guard.cc"
      "$root/util/files.cc" "$root/util/format.cc")
    extra=()
    ;;
  inputs_json)
    sources=("$root/tracer/hf/inputs.cc" "$root/tracer/hf/config.cc"
      "$root/runtime/dtype.cc" "$root/util/json.cc" "$root/util/path_guard.cc"
      "$root/util/files.cc" "$root/util/format.cc")
    extra=(-fno-sanitize=vptr -I"$torch_home/include"
      -I"$torch_home/include/torch/csrc/api/include"
      -L"$torch_home/lib" -Wl,-rpath,"$torch_home/lib"
      -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10 -Wl,--as-needed)
    ;;
  *)
    echo "run_libfuzzer: FUZZ_TARGET must be plan, recipe, safetensors or" \
      "inputs_json" >&2
    exit 1
    ;;
esac
dict=$root/tests/fuzz/testdata/${target%_json}.dict
# Generated corpora (bazel build //tests/fuzz:hostile_seeds) via FUZZ_SEEDS.
seeds=${FUZZ_SEEDS:-$root/tests/fuzz/testdata/${target}_corpus}

start=$SECONDS
"$cxx" -std=c++20 -g -O1 -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$root" -I"$out/gen" "${sources[@]}" "$root/tests/fuzz/${target}_fuzzer.cc" \
  -o "$out/${target}_fuzzer" \
  -L"$absl_dir" -Wl,--as-needed "${absl_libs[@]}" -lprotobuf -pthread \
  "${extra[@]}"
echo "run_libfuzzer: built ${target}_fuzzer in $((SECONDS - start)) s"

args=("$@")
if ((${#args[@]} == 0)); then args=(-runs=20000); fi

start=$SECONDS
# The first corpus directory receives new inputs; the seeds stay untouched.
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ASAN_OPTIONS=detect_leaks=1 \
  "$out/${target}_fuzzer" -dict="$dict" \
  -artifact_prefix="$out/artifacts/" \
  -max_len=8192 -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  "${args[@]}" \
  "$out/corpus" "$seeds"
echo "run_libfuzzer: fuzzed for $((SECONDS - start)) s; corpus and" \
  "artifacts in $out"
