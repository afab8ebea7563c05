#!/usr/bin/env bash
# Runs hf_model_test.py for one model with the project's Python:
#   run_hf_model_test.sh PYTHON HF_MODEL_TEST_PY TRACECUT MODEL_NAME
set -euo pipefail
python=$1 script=$2 tracecut=$3 model=$4
# Transformers and torch write caches under HOME; keep them in the sandbox.
export HOME=${TEST_TMPDIR:-$(mktemp -d)}
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
exec "$python" -W ignore::FutureWarning "$script" "$(realpath "$tracecut")" "$model"
