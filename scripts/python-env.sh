# Sourced by the set-up scripts: picks the Python to install into and run with.
# An active virtual environment is used as it is; otherwise the project's own .venv (created on first use),
# so nothing is ever installed into a system Python (PEP 668 distributions refuse that anyway).
if [ -n "${VIRTUAL_ENV:-}" ]; then
    PY="$VIRTUAL_ENV/bin/python"
else
    if [ ! -x .venv/bin/python ]; then
        base=${PYTHON:-python3}
        if ! "$base" -m venv .venv; then
            rm -rf .venv
            echo "speclens: could not create .venv with $base; on Debian/Ubuntu: sudo apt-get install python3-venv" >&2
            exit 1
        fi
    fi
    PY=.venv/bin/python
fi
