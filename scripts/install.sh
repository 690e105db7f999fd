#!/usr/bin/env bash
# Installs SpecLens and its dependencies into the active virtual environment, else into ./.venv.
# The pinned CPU build of torch goes first: a bare "torch" requirement would pull GBs of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python-env.sh
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[default-models${1:+,$1}]"
