#!/usr/bin/env bash
# Set up .venv if needed, then run the whole test suite (end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# lint first: import bans (no torch in tui/ or mt/, no engine/tui in mt/) are rules here
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q --durations=30 "$@"
