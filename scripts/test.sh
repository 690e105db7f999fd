#!/usr/bin/env bash
# Installs SpecLens with its test dependencies and runs the whole test suite (headless Qt).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh test
export QT_QPA_PLATFORM=offscreen
exec "${PYTHON:-python3}" -m pytest -q "$@"
