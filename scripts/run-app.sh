#!/usr/bin/env bash
# Installs SpecLens with the embedded default model pair (into ./.venv unless a venv is active) and opens the app.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
. scripts/python-env.sh
exec "$PY" -m app.main "$@"
