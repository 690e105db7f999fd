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
# pip runs quietly (its own output is pages of wheels); these lines say what is going on meanwhile.
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "speclens: installing PyTorch (CPU build, ~200 MB; a minute or two)..." >&2
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
echo "speclens: installing SpecLens, its dependencies and the embedded models' parts (${extras}; a minute or two" \
     "the first time)..." >&2
"$PY" -m pip install --quiet -e ".[$extras]"
echo "speclens: installed" >&2
"$PY" scripts/install_state.py record "$extras"
