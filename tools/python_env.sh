#!/usr/bin/env bash
# Where the project's Python environment lives, shared by tools/bootstrap.sh
# (which creates it), tools/python (which runs it) and the @libtorch
# repository rule (which builds against its LibTorch).
#
#   tools/python_env.sh        prints the environment's directory
#
# The environment is a virtual environment of Debian's /usr/bin/python3 with
# the packages of third_party/python/requirements.lock, under
# ${XDG_CACHE_HOME:-~/.cache}/tracecut/ and keyed by the lock file's hash and
# the base Python's version, so a changed lock gets a new environment and
# clones with the same lock share one. TRACECUT_PYTHON_ENV overrides the path.
#
# Sourcing this file only defines the functions below.

# The interpreter every environment is made from.
TRACECUT_BASE_PYTHON=${TRACECUT_BASE_PYTHON:-/usr/bin/python3}

tracecut_repo_root() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd
}

tracecut_python_lock() {
  echo "$(tracecut_repo_root)/third_party/python/requirements.lock"
}

# Prints the environment's directory (it may not exist yet): the first of
# $XDG_CACHE_HOME, ~/.cache and the account's home directory from the password
# database (Bazel runs tests with HOME set to a temporary directory) that
# holds a complete one, else the first of them.
tracecut_python_env_dir() {
  if [[ -n ${TRACECUT_PYTHON_ENV:-} ]]; then
    echo "$TRACECUT_PYTHON_ENV"
    return
  fi
  local lock version key name pw_home candidates=() c
  lock=$(tracecut_python_lock)
  version=$("$TRACECUT_BASE_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || version=none
  key=$({ cat "$lock"; echo "$version"; } | sha256sum | cut -c1-16)
  name="tracecut/python${version}-${key}"
  if [[ -n ${XDG_CACHE_HOME:-} ]]; then candidates+=("$XDG_CACHE_HOME"); fi
  if [[ -n ${HOME:-} ]]; then candidates+=("$HOME/.cache"); fi
  pw_home=$(getent passwd "$(id -u)" 2>/dev/null | cut -d: -f6) || true
  if [[ -n $pw_home ]]; then candidates+=("$pw_home/.cache"); fi
  for c in "${candidates[@]}"; do
    if [[ -f $c/$name/.tracecut-complete ]]; then
      echo "$c/$name"
      return
    fi
  done
  echo "${candidates[0]:-/nonexistent}/$name"
}

# True when the environment is complete: bootstrap writes this marker last.
tracecut_python_env_ready() {
  [[ -f "$(tracecut_python_env_dir)/.tracecut-complete" ]]
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  tracecut_python_env_dir
fi
