#!/usr/bin/env bash
# Set up .venv if needed, then run the whole test suite (end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# lint first: import bans (no torch in tui/ or mt/, no engine/tui in mt/) are rules here
.venv/bin/ruff check --no-cache .  # no cache: a package's new .ruff.toml must take effect
if (($#)); then  # tests named on the command line: as given
    exec .venv/bin/python -m pytest -q --durations=15 "$@"
fi
# the quick tests on both cores, then the end-to-end ones (real processes, terminals, a Slurm
# cluster) on both cores too: no verdict may depend on the machine's load, and two at a time is
# that load. The Slurm tests share one test cluster, on one worker (tests/cluster/conftest.py).
.venv/bin/python -m pytest -q -n 2 -m "not slow" --durations=15
exec .venv/bin/python -m pytest -q -n 2 --dist loadgroup -m slow --durations=25
