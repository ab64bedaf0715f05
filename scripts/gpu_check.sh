#!/usr/bin/env bash
# The prepared GPU check: one command, one table; on a machine without a GPU it runs the same
# logic on tiny shapes in seconds and says that no GPU was measured. See scripts/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false exec "$PY" scripts/gpu_check.py "$@"
