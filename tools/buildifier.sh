#!/usr/bin/env bash
# Runs the buildifier that tools/bootstrap.sh installs (pinned version, from
# the npm package @bazel/buildifier, which bundles prebuilt binaries).
#
#   tools/buildifier.sh [buildifier args...]
#
# The install lives in $TRACECUT_TOOLS_DIR (default ~/.cache/tracecut-tools).
# Set BUILDIFIER=/path/to/buildifier to use another binary instead.
#
# Sourcing this file (as tools/bootstrap.sh does) only defines the variables
# and functions below.

TRACECUT_BUILDIFIER_VERSION=8.2.1

# Directory the pinned version is installed into (an npm prefix).
buildifier_install_dir() {
  echo "$(tracecut_tools_dir)/buildifier-${TRACECUT_BUILDIFIER_VERSION}"
}

tracecut_tools_dir() {
  if [[ -n ${TRACECUT_TOOLS_DIR:-} ]]; then
    echo "$TRACECUT_TOOLS_DIR"
    return
  fi
  # Bazel runs tests without the caller's $HOME: also try the account's home
  # directory from the password database.
  local pw_home home
  pw_home=$(getent passwd "$(id -u)" 2>/dev/null | cut -d: -f6) || true
  for home in "${HOME:-}" "$pw_home"; do
    if [[ -n $home && -d $home/.cache/tracecut-tools ]]; then
      echo "$home/.cache/tracecut-tools"
      return
    fi
  done
  home=${HOME:-$pw_home}
  echo "${home:-/nonexistent}/.cache/tracecut-tools"
}

# Name of the bundled binary for this machine, e.g. buildifier-linux_amd64.
buildifier_platform_binary() {
  local os arch
  case "$(uname -s)" in
    Linux) os=linux ;;
    Darwin) os=darwin ;;
    *) return 1 ;;
  esac
  case "$(uname -m)" in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    riscv64) arch=riscv64 ;;
    *) return 1 ;;
  esac
  echo "buildifier-${os}_${arch}"
}

# Prints the path of the pinned buildifier binary; fails if it is not there.
buildifier_path() {
  if [[ -n ${BUILDIFIER:-} ]]; then
    echo "$BUILDIFIER"
    return
  fi
  local name bin
  name=$(buildifier_platform_binary) || return 1
  bin="$(buildifier_install_dir)/node_modules/@bazel/buildifier/$name"
  [[ -x $bin ]] || return 1
  echo "$bin"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  if ! bin=$(buildifier_path); then
    echo "buildifier ${TRACECUT_BUILDIFIER_VERSION} is not installed" \
      "(looked in $(buildifier_install_dir)): run tools/bootstrap.sh" >&2
    exit 127
  fi
  exec "$bin" "$@"
fi
