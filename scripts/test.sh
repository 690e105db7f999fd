#!/usr/bin/env bash
# Installs SpecLens with its test dependencies (into ./.venv unless a venv is active) and runs the whole
# test suite, headless.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh test
. scripts/python-env.sh
export QT_QPA_PLATFORM=offscreen
exec "$PY" -m pytest -q "$@"
