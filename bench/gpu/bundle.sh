#!/usr/bin/env bash
# Makes the GPU check's bundle (issue 33) on the build machine:
# bench/gpu/out/bundle, which bench/gpu/run.sh uses on a device machine that
# has Python 3.12, torch 2.11 (CUDA 13) and transformers 5.17 but no Bazel
# and no network.
#
#   bash bench/gpu/bundle.sh
#
# 1. PyTorch 2.11.0's wheel for CPython 3.12 (manylinux_2_28 x86_64, the
#    sha256 pinned below) from PyPI, cached in $cache/torch; its
#    torch/include and torch/lib unpacked into $cache/libtorch-2.11.0/torch,
#    the LIBTORCH_HOME of the build. PyPI's default torch 2.11.0 wheel is
#    the CUDA 13.0 one (torch.version.cuda '13.0', __version__
#    '2.11.0+cu130'; it requires the nvidia-*-cu13 / cuda-toolkit 13.0.2
#    wheels). Only the headers and libtorch_cpu / libc10 are linked, so the
#    CUDA variant matters on the device alone, where the image's own torch
#    (and its libtorch_cuda.so, which tracecut loads at run time) is used.
#    The wheel's torch/include/google (Protobuf 3.13 headers, which torch
#    2.14's wheel ships as 3.21.12, Debian's version) is left out: with it,
#    Bazel's -Iexternal/libtorch/include shadows Debian's Protobuf 3.21
#    headers that tracecut's generated .pb.h files need, and nothing of
#    tracecut includes torch's Protobuf. The CUDA 13 runtime libraries
#    that the wheel's libtorch_cpu.so needs (libcudart, libcupti) are the
#    project environment's, linked in as $cache/libtorch-2.11.0/nvidia.
# 2. `bazel build -c opt --keep_going //tools:tracecut` against it, in an
#    output base of its own and without .bazelrc's disk cache (the default
#    build's caches are untouched); on failure, every compiler error.
# 3. bench/gpu/out/bundle:
#      tracecut                the binary (linked against torch 2.11)
#      tracecut.runfiles/      its runfiles as Bazel lays them out: the
#                              exporter and demo sources, the demo fixture,
#                              and libtorch/python, a script that runs
#                              $TRACECUT_PYTHON (default python3)
#      lib/                    the shared libraries it needs that are
#                              neither glibc, the compiler runtime nor
#                              torch's (Abseil, Protobuf, yaml-cpp, zlib)
#      lib/fallback/           this machine's libstdc++.so.6, used only
#                              where the device's lacks a GLIBCXX/CXXABI
#                              version the binary or lib/ needs
#      bin/tracecut            the wrapper to run: finds the device's
#                              torch/lib (TORCH_LIB, else python3 -c
#                              'import torch'), sets LD_LIBRARY_PATH, execs
#      wheels/                 llm-compressor, compressed-tensors and their
#                              dependencies for CPython 3.12 at the lock's
#                              versions (collect_wheels.py; MANIFEST.tsv),
#                              but the large ones the device image has,
#                              which go to bench/gpu/out/wheels-extra (a
#                              device call carries 64 MiB at most)
#      BUILD_INFO.json         source, torch wheel, symbol versions, sizes
# 4. Checks: bin/tracecut --help, `partition` of the bundled Llama fixture
#    and `export` + `partition` of a tiny transformers Llama, all with
#    TORCH_LIB at the unpacked torch 2.11 torch/lib (the device's stand-in)
#    and the exporter run by the project's Python; then a summary.
#
# Environment:
#   TRACECUT_SRC              the tree to build (default: this checkout)
#   TRACECUT_SRC_REV          a commit (e.g. HEAD) to build instead, from a
#                             `git archive` of it in $cache/src: a checkout
#                             edited while Bazel compiles can get objects of
#                             a half-edited header linked in
#   TRACECUT_GPU_OUTPUT_BASE  Bazel output base (default: one per source
#                             tree under /tmp)
#   TRACECUT_GPU_CACHE        downloads (default ~/.cache/tracecut/gpu-bundle)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
source "$repo/tools/python_env.sh"

TORCH_VERSION=2.11.0
TORCH_WHEEL=torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl
TORCH_SHA256=0f68f4ac6d95d12e896c3b7a912b5871619542ec54d3649cf48cc1edd4dd2756
# The native part (binary + lib/) must stay below this.
NATIVE_LIMIT_MIB=60

cache=${TRACECUT_GPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tracecut/gpu-bundle}
src_rev=
if [[ -n ${TRACECUT_SRC_REV:-} ]]; then
  src_rev=$(git -C "$repo" rev-parse --verify "$TRACECUT_SRC_REV^{commit}")
  src=$cache/src
  rm -rf "$src.tmp"
  mkdir -p "$src.tmp"
  git -C "$repo" archive "$src_rev" | tar -x -C "$src.tmp"
  rm -rf "$src"
  mv "$src.tmp" "$src"
else
  src=$(cd "${TRACECUT_SRC:-$repo}" && pwd)
fi
src_key=$(printf %s "$src" | sha256sum | cut -c1-8)
output_base=${TRACECUT_GPU_OUTPUT_BASE:-/tmp/tracecut-gpu-ob-$src_key}
out=$here/out
bundle=$out/bundle
py=$(tracecut_python_env_dir)/bin/python
start=$SECONDS

say() { printf '[bundle +%4ds] %s\n' "$((SECONDS - start))" "$*"; }
die() {
  echo "bundle.sh: $*" >&2
  exit 1
}

[[ -x $py ]] || die "no project Python at $py: run tools/bootstrap.sh"
for tool in unzip objdump ldd sha256sum bazel; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
mkdir -p "$out" "$cache/torch"

# 1. The torch wheel (pinned) and its headers and libraries.
wheel=$cache/torch/$TORCH_WHEEL
if ! echo "$TORCH_SHA256  $wheel" | sha256sum -c --status 2>/dev/null; then
  say "downloading $TORCH_WHEEL from PyPI"
  rm -f "$wheel"
  req=$(mktemp)
  echo "torch==$TORCH_VERSION --hash=sha256:$TORCH_SHA256" >"$req"
  "$py" -m pip download --quiet --no-deps --require-hashes -r "$req" \
    --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --platform manylinux_2_28_x86_64 -d "$cache/torch"
  rm -f "$req"
  echo "$TORCH_SHA256  $wheel" | sha256sum -c --status ||
    die "$wheel does not have the pinned sha256 $TORCH_SHA256"
fi
home=$cache/libtorch-$TORCH_VERSION
libtorch=$home/torch
stamp="$TORCH_SHA256 include lib -include/google"
if [[ ! -f $home/.complete || $(cat "$home/.complete") != "$stamp" ]]; then
  say "unpacking torch/include and torch/lib into $home"
  rm -rf "$home.tmp"
  mkdir -p "$home.tmp"
  unzip -q "$wheel" 'torch/include/*' 'torch/lib/*' -x 'torch/include/google/*' \
    -d "$home.tmp"
  echo "$stamp" >"$home.tmp/.complete"
  rm -rf "$home"
  mv "$home.tmp" "$home"
fi
# The CUDA wheel's libtorch_cpu.so needs the CUDA 13 runtime (libcudart,
# libcupti) to link and to load, even on the CPU; it finds it through its
# RPATH $ORIGIN/../../nvidia/cu13/lib. The project's environment (torch
# 2.14, CUDA 13.0) has those libraries with the same sonames: linked there.
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[[ -d $site/nvidia/cu13/lib ]] ||
  die "no CUDA 13 runtime at $site/nvidia/cu13/lib (the project's environment)"
ln -sfn "$site/nvidia" "$home/nvidia"

# 2. The build.
# No disk cache: the build's actions differ from the usual ones (torch
# 2.11's headers) and share nothing worth the risk of an output cached while
# a source changed under it (the checkout is edited while builds run).
bazel_cmd=(bazel "--output_base=$output_base")
build_flags=(-c opt --symlink_prefix=/ --disk_cache=)
say "building //tools:tracecut -c opt in $src against torch $TORCH_VERSION" \
  "(output base $output_base; log $out/build.log)"
# --keep_going: a failure lists every file that does not compile.
if ! (cd "$src" && LIBTORCH_HOME=$libtorch "${bazel_cmd[@]}" build \
  "${build_flags[@]}" --keep_going //tools:tracecut) >"$out/build.log" 2>&1; then
  echo "bundle.sh: the build against torch $TORCH_VERSION failed; its errors" \
    "($out/build.log):" >&2
  grep -E -A3 'error:|ERROR:' "$out/build.log" | head -n 60 >&2
  exit 1
fi
bin=$(cd "$src" && LIBTORCH_HOME=$libtorch "${bazel_cmd[@]}" info \
  "${build_flags[@]}" bazel-bin 2>/dev/null)
manifest=$bin/tools/tracecut.runfiles_manifest
[[ -f $bin/tools/tracecut && -f $manifest ]] || die "no tracecut in $bin/tools"

# 3. The bundle, assembled beside the old one and swapped in at the end.
tmp=$bundle.tmp
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/lib/fallback"
install -m 755 "$bin/tools/tracecut" "$tmp/tracecut"

# Runfiles: found by the binary from /proc/self/exe + ".runfiles" (Bazel's
# runfiles library, directory mode: no MANIFEST, whose absolute paths would
# name this machine).
python_launcher() {
  cat <<'EOF'
#!/bin/sh
# tracecut's Python (bench/gpu/bundle.sh): the machine's, not the build's.
# bin/tracecut put the bundle's libraries on LD_LIBRARY_PATH for tracecut;
# Python gets the caller's LD_LIBRARY_PATH back.
if [ -n "${TRACECUT_SAVED_LD_LIBRARY_PATH+set}" ]; then
  if [ -n "$TRACECUT_SAVED_LD_LIBRARY_PATH" ]; then
    LD_LIBRARY_PATH=$TRACECUT_SAVED_LD_LIBRARY_PATH
    export LD_LIBRARY_PATH
  else
    unset LD_LIBRARY_PATH
  fi
fi
exec "${TRACECUT_PYTHON:-python3}" "$@"
EOF
}
rf=$tmp/tracecut.runfiles
while read -r name target; do
  mkdir -p "$(dirname "$rf/$name")"
  case $name in
    libtorch/python | */external/libtorch/python)
      python_launcher >"$rf/$name"
      chmod 755 "$rf/$name"
      ;;
    tracecut/tools/tracecut) ;; # the binary itself: not needed
    *)
      if [[ -z $target ]]; then : >"$rf/$name"; else cp -L "$target" "$rf/$name"; fi
      ;;
  esac
done <"$manifest"
for f in tracecut/python/tracecut_export.py libtorch/python; do
  [[ -e $rf/$f ]] || die "runfile $f is missing (the manifest changed?)"
done

# Shared libraries: all that ldd resolves, but glibc's, the compiler
# runtime's and torch's own (the device's torch/lib provides those).
while read -r name path; do
  case $name in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libpthread.so.* | \
      libdl.so.* | librt.so.* | libutil.so.* | libresolv.so.* | libmvec.so.* | \
      libgcc_s.so.*) ;;
    libstdc++.so.*) cp -L "$path" "$tmp/lib/fallback/$name" ;;
    libtorch*.so* | libc10*.so* | libshm.so* | libcaffe2*.so*) ;;
    *)
      # torch's own (libgomp) and the CUDA runtime it loads (libcudart,
      # libcupti): the device's torch installation has them.
      real=$(realpath "$path")
      if [[ $real != "$home/"* && $real != "$site/"* ]]; then
        cp -L "$path" "$tmp/lib/$name"
      fi
      ;;
  esac
done < <(ldd "$tmp/tracecut" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
if ldd "$tmp/tracecut" | grep -q 'not found'; then
  ldd "$tmp/tracecut" | grep 'not found' >&2
  die "the binary has unresolved libraries"
fi
chmod 644 "$tmp"/lib/*.so* "$tmp"/lib/fallback/*

# The symbol versions the binary and lib/ need (undefined symbols only).
needed() {
  objdump -T "$tmp/tracecut" "$tmp"/lib/*.so* 2>/dev/null |
    awk '/\*UND\*/' | grep -o "$1[0-9][0-9.]*" | sort -uV | tail -n 1
}
glibc=$(needed GLIBC_)
glibcxx=$(needed GLIBCXX_)
cxxabi=$(needed CXXABI_)
gcc_s=$(needed GCC_)
provided=$(grep -aow 'GLIBCXX_3\.4\.[0-9]*' "$tmp/lib/fallback/libstdc++.so.6" | sort -uV | tail -n 1)

# The wrapper.
cat >"$tmp/bin/tracecut" <<EOF
#!/usr/bin/env bash
# Generated by bench/gpu/bundle.sh: runs the bundled tracecut (built against
# torch $TORCH_VERSION's headers) with this machine's PyTorch.
#   TORCH_LIB        torch/lib of the PyTorch to run with (default: the one
#                    "\$TRACECUT_PYTHON -c 'import torch'" finds)
#   TRACECUT_PYTHON  the Python of that lookup and of \`tracecut export\`
#                    (default python3)
#   TRACECUT_BUNDLE_FALLBACK  1 or 0 forces lib/fallback's libstdc++ on or
#                    off (default: on when the system's lacks $glibcxx or
#                    $cxxabi)
set -euo pipefail
bundle=\$(cd "\$(dirname "\$(readlink -f "\${BASH_SOURCE[0]}")")/.." && pwd)
needs=($glibcxx $cxxabi)
EOF
cat >>"$tmp/bin/tracecut" <<'EOF'
python=${TRACECUT_PYTHON:-python3}
if [[ -z ${TORCH_LIB:-} ]]; then
  if ! TORCH_LIB=$("$python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))'); then
    echo "tracecut (bundle): cannot import torch with $python; set TORCH_LIB" \
      "to a PyTorch's torch/lib directory" >&2
    exit 1
  fi
fi
if [[ ! -e $TORCH_LIB/libtorch_cpu.so ]]; then
  echo "tracecut (bundle): no libtorch_cpu.so in TORCH_LIB=$TORCH_LIB" >&2
  exit 1
fi

# The libstdc++ the loader would take without the bundle.
system_libstdcxx() {
  local d dirs=()
  IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
  dirs+=("$TORCH_LIB")
  for d in "${dirs[@]}"; do
    if [[ -n $d && -e $d/libstdc++.so.6 ]]; then
      echo "$d/libstdc++.so.6"
      return
    fi
  done
  local p
  p=$({ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null |
    awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}') || true
  if [[ -n $p ]]; then
    echo "$p"
    return
  fi
  for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64; do
    if [[ -e $d/libstdc++.so.6 ]]; then
      echo "$d/libstdc++.so.6"
      return
    fi
  done
}

fallback=${TRACECUT_BUNDLE_FALLBACK:-}
if [[ -z $fallback ]]; then
  fallback=0
  lib=$(system_libstdcxx)
  for v in "${needs[@]}"; do
    if [[ -z $lib ]] || ! grep -qaw "$v" "$lib"; then fallback=1; fi
  done
fi
path=$bundle/lib:$TORCH_LIB
if [[ $fallback == 1 ]]; then path=$path:$bundle/lib/fallback; fi
export TRACECUT_SAVED_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH=$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset RUNFILES_DIR RUNFILES_MANIFEST_FILE JAVA_RUNFILES
exec "$bundle/tracecut" "$@"
EOF
chmod 755 "$tmp/bin/tracecut"

# The wheels. A device call carries at most 64 MiB (the working tree
# included), and all of them are about 100 MiB, most of it pyarrow, numpy,
# pandas and pillow, which the device image has (the workplace's package
# list of its 'cuda' image, 2026-11-17). So the wheels over 2 MiB of
# packages that image holds go to $out/wheels-extra, which travels only
# when a call carries it too; run.sh installs from both directories, and
# reports a requirement the image misses whose wheel stayed behind.
# BUNDLE_ALL_WHEELS=1 keeps every wheel in bundle/wheels.
IMAGE_HAS=" accelerate anyio certifi charset-normalizer click filelock fsspec
  h11 hf-xet httpcore httpx huggingface-hub idna numpy nvidia-ml-py packaging
  pandas pillow psutil py-cpuinfo pyarrow python-dateutil pyyaml requests
  safetensors tqdm typing-extensions urllib3 xxhash "
say "collecting wheels (llm-compressor, compressed-tensors and dependencies)"
"$py" "$here/collect_wheels.py" "$src/third_party/python/requirements.lock" \
  "$cache/wheels-py312" "$tmp/wheels"
rm -rf "$out/wheels-extra"
mkdir -p "$out/wheels-extra"
if [[ ${BUNDLE_ALL_WHEELS:-0} != 1 ]]; then
  while IFS=$'\t' read -r name _ file _; do
    [[ $name == "#"* || $IMAGE_HAS != *" $name "* ]] && continue
    if (($(stat -c %s "$tmp/wheels/$file") > 2 * 1048576)); then
      mv "$tmp/wheels/$file" "$out/wheels-extra/"
    fi
  done <"$tmp/wheels/MANIFEST.tsv"
fi

rm -rf "$bundle"
mv "$tmp" "$bundle"

# 4. Checks, with the unpacked torch 2.11 standing in for the device's.
say "checking the bundle against $libtorch/lib"
export TORCH_LIB=$libtorch/lib
verify=$out/verify
rm -rf "$verify"
mkdir -p "$verify"
"$bundle/bin/tracecut" --help >"$verify/help.txt" ||
  die "bin/tracecut --help failed"
TRACECUT_BUNDLE_FALLBACK=1 "$bundle/bin/tracecut" --help >/dev/null ||
  die "bin/tracecut --help failed with lib/fallback's libstdc++"
fixture=$bundle/tracecut.runfiles/tracecut/tests/fixtures/llama.pt
"$bundle/bin/tracecut" partition "$fixture" >"$verify/partition_fixture.txt" 2>&1 ||
  die "bin/tracecut partition $fixture failed: $(tail -n 5 "$verify/partition_fixture.txt")"
# `export` runs the exporter from the bundle's runfiles with the project's
# Python (torch 2.14 writes the .pt2 here; the device's Python is 2.11).
export_check="skipped"
if "$py" "$here/make_model.py" "$verify" --size=tiny --nsamples=2 --seqlen=16 \
  --held=1x8 --device=cpu >"$verify/make_model.log" 2>&1 &&
  TRACECUT_PYTHON=$py "$bundle/bin/tracecut" export "$verify/model" --meta \
    -o "$verify/model/model.pt2" >"$verify/export.log" 2>&1; then
  if "$bundle/bin/tracecut" partition "$verify/model" >"$verify/partition_export.txt" 2>&1; then
    export_check="ok (export by the project's Python, partition by the bundle)"
  else
    export_check="export ok; partition of its .pt2 FAILED (torch 2.14 wrote it, 2.11 reads it): $(tail -n 3 "$verify/partition_export.txt")"
  fi
else
  die "bin/tracecut export of a tiny Llama failed: $(tail -n 8 "$verify/export.log" "$verify/make_model.log")"
fi

# Summary.
mib() { du -sm "$@" | awk '{s += $1} END {print s}'; }
native=$(du -cb "$bundle/tracecut" "$bundle/lib" | tail -n 1 | cut -f1)
native_mib=$(((native + 1048575) / 1048576))
total=$(du -sb "$bundle" | cut -f1)
total_mib=$(((total + 1048575) / 1048576))
nwheels=$(find "$bundle/wheels" -name '*.whl' | wc -l)
nextra=$(find "$out/wheels-extra" -name '*.whl' | wc -l)
# What a device call carries besides the bundle: the repository's tracked
# and untracked, not ignored files.
tree=$(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
  du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1) || tree=0
tree_mib=$(((tree + 1048575) / 1048576))
if [[ -n $src_rev ]]; then
  commit=$src_rev
  dirty=0
else
  commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
  dirty=$(git -C "$src" status --porcelain 2>/dev/null | grep -c . || true)
fi
cat >"$bundle/BUILD_INFO.json" <<EOF
{
 "source": "$src",
 "git_commit": "$commit",
 "git_changed_files": ${dirty:-0},
 "built_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
 "torch_wheel": "$TORCH_WHEEL",
 "torch_wheel_sha256": "$TORCH_SHA256",
 "glibc_needed": "$glibc",
 "glibcxx_needed": "$glibcxx",
 "cxxabi_needed": "$cxxabi",
 "gcc_s_needed": "$gcc_s",
 "fallback_libstdcxx_provides": "$provided",
 "native_bytes": $native,
 "bundle_bytes": $total,
 "wheels": $nwheels,
 "wheels_extra": $nextra
}
EOF
libs=$(find "$bundle/lib" -maxdepth 1 -name '*.so*' -printf '%f\n' |
  sed -e 's/\.so.*//' -e 's/_.*//' | sort | uniq -c |
  awk '{printf "%s%s x%d", sep, $2, $1; sep=", "}')
echo
echo "bundle: $bundle: $total_mib MiB"
echo "  native part $native_mib MiB (limit $NATIVE_LIMIT_MIB): binary" \
  "$(mib "$bundle/tracecut") MiB, lib/ $(mib "$bundle/lib") MiB ($libs;" \
  "lib/fallback: libstdc++.so.6 up to $provided)"
echo "  runfiles $(mib "$bundle/tracecut.runfiles") MiB; wheels/ $nwheels" \
  "wheels $(mib "$bundle/wheels") MiB; left out of the bundle:" \
  "$out/wheels-extra, $nextra wheels $(mib "$out/wheels-extra") MiB"
echo "  built from $src ($commit, $dirty changed files) against $TORCH_WHEEL"
echo "  needs: $glibc, $glibcxx, $cxxabi, $gcc_s"
echo "  checks (TORCH_LIB=$TORCH_LIB): --help ok; partition of the llama.pt" \
  "fixture ok; export: $export_check"
echo "  a device call carries the repository ($tree_mib MiB) and the bundle:" \
  "$((tree_mib + total_mib)) MiB of 64;" \
  "run(command='bash bench/gpu/run.sh', carry=['bench/gpu/out/bundle'])"
if ((native_mib >= NATIVE_LIMIT_MIB)); then
  die "the native part is $native_mib MiB, over the $NATIVE_LIMIT_MIB MiB limit"
fi
if ((tree_mib + total_mib > 64)); then
  echo "bundle.sh: WARNING: repository + bundle = $((tree_mib + total_mib))" \
    "MiB, over a device call's 64 MiB" >&2
fi
say "done"
