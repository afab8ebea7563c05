#!/usr/bin/env bash
# Installs the Debian packages tracecut builds and tests with (apt-get), and
# buildifier (npm package @bazel/buildifier, pinned in tools/buildifier.sh,
# into ~/.cache/tracecut-tools). Idempotent: installs only what is missing and
# prints nothing when everything is already there.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/buildifier.sh
source "$script_dir/buildifier.sh"

packages=(
  bazel-bootstrap bazel-rules-java bazel-platforms bazel-skylib
  g++ clang libclang-rt-14-dev clang-format
  libtorch-dev libabsl-dev libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev
  python3 python3-torch graphviz
)
# npm installs buildifier; Debian's nodejs and npm only when npm is missing.
need_buildifier=0
if ! buildifier_path >/dev/null; then
  need_buildifier=1
  if ! command -v npm >/dev/null; then packages+=(nodejs npm); fi
fi

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

if ((need_buildifier)); then
  dest=$(buildifier_install_dir)
  echo "bootstrap: installing buildifier ${TRACECUT_BUILDIFIER_VERSION} (npm) into $dest" >&2
  mkdir -p "$(dirname "$dest")"
  # Install into a temporary prefix and move it into place, so an interrupted
  # install never looks like a finished one.
  tmp=$(mktemp -d "$dest.tmp.XXXXXX")
  log="$tmp.log"
  if ! npm install --prefix "$tmp" --no-audit --no-fund --loglevel=error \
    "@bazel/buildifier@${TRACECUT_BUILDIFIER_VERSION}" >"$log" 2>&1; then
    cat "$log" >&2
    rm -rf "$tmp" "$log"
    echo "bootstrap: npm install @bazel/buildifier@${TRACECUT_BUILDIFIER_VERSION} failed" >&2
    exit 1
  fi
  rm -f "$log"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  if ! bin=$(buildifier_path) || ! "$bin" --version >/dev/null 2>&1; then
    echo "bootstrap: buildifier was installed but does not run (no prebuilt" \
      "binary for $(uname -s) $(uname -m) in $dest?)" >&2
    exit 1
  fi
fi
