#!/usr/bin/env bash
# Builds the binary wheel (the CPU kernels prebuilt by setup.py) and checks that, installed on its own, it loads
# them with no compiler on PATH and an empty SPECLENS_CACHE: `python -m engine.cpu` names the kernels and where
# they came from, then `python -m app.main --load-test` loads the embedded pair (provisioned into the usual cache
# first, since an empty cache has no models) and prints its `load-test ok` line. Exit 1 on the fallback.
#
# The wheel is installed with --no-deps into a folder of its own, put first on PYTHONPATH, and run by the project's
# Python from outside the checkout: its dependencies (torch, PySide6, ...) are this environment's, the `engine` and
# `app` packages and the kernels are the wheel's (checked below).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python-env.sh
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

t0=$(date +%s)
SPECLENS_PREBUILD_KERNELS=1 "$PY" -m pip wheel --quiet --no-build-isolation --no-deps . -w "$work/dist" >/dev/null
wheel=$(ls "$work"/dist/speclens-*.whl)
echo "wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KB, built in $(( $(date +%s) - t0 )) s"
"$PY" -m pip install --quiet --no-deps --target "$work/site" "$wheel"
pair=$("$PY" -c "from engine.io.provision import default_pair; print(*default_pair())")
read -r target draft <<<"$pair"

mkdir "$work/cache" "$work/run"
cd "$work/run"  # not the checkout, whose packages would otherwise be importable
run() { env PATH="" PYTHONPATH="$work/site" SPECLENS_CACHE="$work/cache" QT_QPA_PLATFORM=offscreen "$PY" "$@"; }
run -c "import engine, app, sys; sys.exit(0 if engine.__file__.startswith('$work/site') and app.__file__.startswith('$work/site') else 'not the wheel: ' + engine.__file__)"
run -m engine.cpu
run -c "from engine.cpu import ext; ext.load(); import sys; sys.exit(0 if ext.outcome().source == 'prebuilt' else 1)"
run -m app.main --load-test --settings "$work/run/s.ini" --target "$target" --draft "$draft" | tail -2
# nothing built: the cache holds at most the machine's kernel tile choice (engine/cpu/tune.py)
test -z "$(ls -A "$work/cache" | grep -vx kernel-tuning.json)" || { echo "the cache holds more than the tile choice: $(ls -R "$work/cache" | head)"; exit 1; }
