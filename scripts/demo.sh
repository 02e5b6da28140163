#!/usr/bin/env bash
# Set up .venv if needed, then train the tiny preset on the CPU with the live dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/mt launch presets/tiny-cpu.toml "$@"
