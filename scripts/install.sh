#!/usr/bin/env bash
# Installs SpecLens and its dependencies into the active virtual environment, else into ./.venv.
# The pinned CPU build of torch goes first: a bare "torch" requirement would pull GBs of CUDA wheels.
# When this environment was installed from this checkout with the same pyproject.toml and extras, and still has
# every package, pip is skipped (scripts/install_state.py): run-app.sh then opens the app at once.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python-env.sh
extras="default-models${1:+,$1}"
if "$PY" scripts/install_state.py check "$extras" 2>/dev/null; then
    exit 0
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[$extras]"
"$PY" scripts/install_state.py record "$extras"
