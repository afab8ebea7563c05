#!/usr/bin/env bash
# Runs a Python test script with the project's Python:
#   run_python_test.sh PYTHON SCRIPT TRACECUT [ARGS...]
# TRACECUT is made absolute (the script runs it from temporary directories).
set -euo pipefail
python=$1 script=$2 tracecut=$3
shift 3
# Transformers and torch write caches under HOME; keep them in the sandbox.
export HOME=${TEST_TMPDIR:-$(mktemp -d)}
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
exec "$python" -W ignore::FutureWarning "$script" "$(realpath "$tracecut")" "$@"
