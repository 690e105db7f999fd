#!/usr/bin/env bash
# Installs SpecLens with the embedded default model pair and opens the app.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
exec "${PYTHON:-python3}" -m app.main "$@"
