#!/usr/bin/env bash
# Builds the PyInstaller bundle (packaging/speclens.spec: the CPU kernels go in prebuilt) and runs its --load-test
# with PATH emptied (no compiler, no ninja) and an empty SPECLENS_CACHE, on the embedded pair (provisioned into
# the usual cache first: the frozen app cannot see the part packages, and an empty cache has no models). The last
# line is the bundle's own `load-test ok: ... (Q4_K_M, int8 activations, <ISA> kernels) ...`; exit 1 when the
# bundle ran the fallback or failed.
#
#   packaging/check_bundle.sh [DIST]   # DIST: where the bundle goes (default: dist/, kept); a temporary build folder
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python-env.sh
dist=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

t0=$(date +%s)
"$PY" -m PyInstaller --noconfirm --log-level WARN --distpath "$dist" --workpath "$work/build" packaging/speclens.spec
echo "bundle: $dist/speclens, $(du -sm "$dist/speclens" | cut -f1) MB, built in $(( $(date +%s) - t0 )) s"
pair=$("$PY" -c "from engine.io.provision import default_pair; print(*default_pair())")
read -r target draft <<<"$pair"

mkdir "$work/cache"
out=$(cd "$work" && env PATH="" SPECLENS_CACHE="$work/cache" QT_QPA_PLATFORM=offscreen \
    "$dist/speclens/speclens" --load-test --settings "$work/s.ini" --target "$target" --draft "$draft" 2>"$work/err") \
    || { echo "$out"; tail -20 "$work/err"; exit 1; }
echo "$out"
case "$out" in
    *"load-test ok"*"fallback"*|*"could not"*) echo "the bundle ran without its kernels"; exit 1 ;;
    *"load-test ok"*" kernels)"*) ;;
    *) echo "no load-test ok line"; exit 1 ;;
esac
# nothing built: the bundle writes at most the machine's kernel tile choice (engine/cpu/tune.py)
test -z "$(ls -A "$work/cache" | grep -vx kernel-tuning.json)" || { echo "the bundle wrote into its empty cache: $(ls -R "$work/cache" | head)"; exit 1; }
