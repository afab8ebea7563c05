#!/usr/bin/env bash
# Formats the tree: clang-format (style from /.clang-format) on *.cc *.h
# *.proto, buildifier on BUILD, BUILD.bazel, *.BUILD, *.bzl, WORKSPACE.
# Files considered: tracked and untracked-but-not-ignored (git), or every
# file outside bazel-* and .git when the tree is not a git checkout.
#
#   tools/format.sh          format in place; prints the files it changed
#   tools/format.sh --check  change nothing; list the files that need
#                            formatting and exit 1 if there are any
#
# Exit status: 0 clean (or formatted), 1 files need formatting (--check),
# 2 a tool is missing or failed.
set -euo pipefail

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  -h | --help)
    sed -n '2,12s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
    ;;
  *)
    echo "usage: tools/format.sh [--check]" >&2
    exit 2
    ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root"
clang_format=${CLANG_FORMAT:-clang-format}

list_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard
  else
    find . \( -name 'bazel-*' -o -name .git \) -prune -o -type f -print0 |
      sed -z 's|^\./||'
  fi
}

cc_files=()
bzl_files=()
while IFS= read -r -d '' f; do
  [[ -f $f && ! -L $f ]] || continue # deleted but still tracked, or a link
  case "${f##*/}" in
    *.cc | *.h | *.proto) cc_files+=("$f") ;;
    BUILD | BUILD.bazel | *.BUILD | *.bzl | WORKSPACE | WORKSPACE.bazel) bzl_files+=("$f") ;;
  esac
done < <(list_files | sort -zu)

bad=()

if ((${#cc_files[@]})); then
  if ! command -v "$clang_format" >/dev/null; then
    echo "format.sh: $clang_format not found: run tools/bootstrap.sh" >&2
    exit 2
  fi
  # One clang-format per file, in parallel; prints the files whose formatted
  # text differs from what is on disk.
  # shellcheck disable=SC2016 # the inner script expands its own arguments
  while IFS= read -r f; do bad+=("$f"); done < <(
    printf '%s\0' "${cc_files[@]}" |
      xargs -0 -n 16 -P "$(nproc 2>/dev/null || echo 4)" \
        bash -c 'cf=$1; shift; for f; do "$cf" --style=file "$f" | cmp -s - "$f" || echo "$f"; done' \
        _ "$clang_format" |
      sort
  )
fi

if ((${#bzl_files[@]})); then
  if ! "$root/tools/buildifier.sh" --version >/dev/null 2>&1; then
    "$root/tools/buildifier.sh" --version >/dev/null || true # says why
    echo "format.sh: buildifier is missing: run tools/bootstrap.sh" >&2
    exit 2
  fi
  # buildifier -mode=check writes "FILE # reformat" lines (and any syntax
  # errors) to stderr; exit status 4 means some files need reformatting.
  rc=0
  out=$("$root/tools/buildifier.sh" -mode=check "${bzl_files[@]}" 2>&1) || rc=$?
  while IFS= read -r line; do
    if [[ $line == *" # reformat" ]]; then
      bad+=("${line% # reformat}")
    elif [[ -n $line ]]; then
      echo "$line" >&2
    fi
  done <<<"$out"
  if ((rc != 0 && rc != 4)); then
    echo "format.sh: buildifier failed (exit $rc)" >&2
    exit 2
  fi
fi

((${#bad[@]})) || exit 0

if ((check)); then
  echo "format.sh: ${#bad[@]} file(s) need formatting (run tools/format.sh):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi

for f in "${bad[@]}"; do
  case "${f##*/}" in
    *.cc | *.h | *.proto) "$clang_format" --style=file -i "$f" ;;
    *) "$root/tools/buildifier.sh" -mode=fix "$f" ;;
  esac
  echo "formatted $f"
done
