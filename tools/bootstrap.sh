#!/usr/bin/env bash
# Installs, with apt-get only, the Debian packages tracecut builds and tests
# with. Idempotent: installs only what is missing and prints nothing when
# everything is already there.
set -euo pipefail

packages=(
  bazel-bootstrap bazel-rules-java bazel-platforms bazel-skylib
  g++ clang libclang-rt-14-dev clang-format
  libtorch-dev libabsl-dev libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev
  python3 python3-torch graphviz
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}" >&2
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq >/dev/null
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
