#!/usr/bin/env bash
# Installs what tracecut builds and tests with: Debian packages (apt-get);
# buildifier (npm package @bazel/buildifier, pinned in tools/buildifier.sh,
# into ~/.cache/tracecut-tools); and the project's Python environment (PyPI,
# third_party/python/requirements.lock with hashes, into the directory that
# tools/python_env.sh names), whose PyTorch is also the LibTorch the C++ code
# builds against. Idempotent: installs only what is missing and prints nothing
# when everything is already there.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/buildifier.sh
source "$script_dir/buildifier.sh"
# shellcheck source=tools/python_env.sh
source "$script_dir/python_env.sh"

packages=(
  bazel-bootstrap bazel-rules-java bazel-platforms bazel-skylib
  g++ clang libclang-rt-14-dev clang-format
  libabsl-dev libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev
  libyaml-cpp-dev
  libgloo-dev
  python3 python3-venv graphviz
  strace zip
  # Headless Chromium renders the HTML reports in //tests/report (tests only).
  chromium
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

if ! tracecut_python_env_ready; then
  env_dir=$(tracecut_python_env_dir)
  lock=$(tracecut_python_lock)
  echo "bootstrap: creating the Python environment $env_dir from" \
    "third_party/python/requirements.lock (PyTorch with its CUDA runtime" \
    "wheels, several GB; a few minutes)" >&2
  # Start from scratch: a directory without the completion marker is what an
  # interrupted install left behind.
  rm -rf "$env_dir"
  mkdir -p "$(dirname "$env_dir")"
  log="$env_dir.log"
  if ! { "$TRACECUT_BASE_PYTHON" -m venv "$env_dir" &&
    "$env_dir/bin/python" -m pip install --require-hashes --no-deps \
      --only-binary=:all: --no-input --progress-bar=off -r "$lock"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "bootstrap: installing the Python environment failed (log: $log)" >&2
    exit 1
  fi
  if ! "$env_dir/bin/python" -c 'import torch, transformers, compressed_tensors' >>"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "bootstrap: the new Python environment $env_dir does not import torch (log: $log)" >&2
    exit 1
  fi
  rm -f "$log"
  touch "$env_dir/.tracecut-complete"
fi
