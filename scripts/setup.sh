#!/usr/bin/env bash
# Create .venv (once) and install mt with its test tools. Never replaces a torch that is
# already importable: users with GPUs install their own CUDA build first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    # system site packages: a torch the user installed system-wide (CUDA build) stays visible
    "$PY" -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
fi
stamp=.venv/.mt-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q -e ".[test,hf]"   # the tests cover the hf extra too
    touch "$stamp"
fi
