"""How soon a notification leaves the supervisor: incident to receipt at a local HTTP receiver.

Usage: python bench/notify_latency.py [--repeat N]. Runs N tiny 2-rank CPU runs under `mt launch
--headless` with `[monitor] notify = ["json://127.0.0.1:PORT/mt"]` (apprise's JSON POST to
tests/mirror/receiver.py), alternately with a planted NaN (the engine's `nan_loss` incident: from its
`incident` event's `t`) and a crash of rank 1 (the supervisor's `crash` incident: from its
incidents.jsonl line's `t`, as no event carries it), and prints each latency to the receipt, then the
run's end (status.json `ended` to the receipt of the end notification). Goal: within 5 s.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cli.conftest import events, mt, run_dir_from, status, write_preset
from tests.mirror.receiver import Receiver, receiver

FAULTS = {"nan": {"nan_at_step": 10}, "crash": {"crash_at_step": 10, "crash_rank": 1}}


def filed(run_dir: Path, code: str) -> float:
    """When the incident happened: the engine's event for a NaN, the supervisor's line for a crash."""
    evs = [e["t"] for e in events(run_dir, "incident") if e["code"] == code]
    if evs:
        return evs[0]
    lines = [json.loads(x) for x in (run_dir / "incidents.jsonl").read_text().splitlines()]
    return next(r["t"] for r in lines if r["code"] == code and r["status"] == "open")


def one(kind: str, root: Path, rec: Receiver) -> tuple[str, float, float]:
    """(incident code, seconds from the incident to its receipt, from the run's end to the end's receipt)."""
    root.mkdir(parents=True)
    n = len(rec.received())
    preset = write_preset(root / f"{kind}.toml", root / "runs", monitor={"notify": [rec.url()]}, faults=FAULTS[kind],
                          train={"max_steps": 24})
    done = mt("launch", preset, "--headless")
    run_dir = run_dir_from(done.stdout)
    deadline = time.monotonic() + 60
    while len(rec.received()) < n + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    got = rec.received()[n:]
    code = "nan_loss" if kind == "nan" else "crash"
    inc = next(g for g in got if not g.title.endswith((": completed", ": failed")))
    end = next(g for g in got if g.title.endswith((": completed", ": failed")))
    return code, inc.t - filed(run_dir, code), end.t - status(run_dir)["ended"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each fault")
    args = ap.parse_args()
    rows: dict[str, list[float]] = {"nan_loss": [], "crash": [], "end": []}
    with tempfile.TemporaryDirectory() as tmp, receiver() as rec:
        for i in range(args.repeat):
            for kind in FAULTS:
                code, inc, end = one(kind, Path(tmp) / f"{kind}-{i}", rec)
                rows[code].append(inc)
                rows["end"].append(end)
                print(f"{code:9} incident -> receipt {inc:6.2f} s   end -> receipt {end:6.2f} s", flush=True)
    for name, xs in rows.items():
        print(f"{name:9} median {statistics.median(xs):.2f} s  max {max(xs):.2f} s  (n={len(xs)})")


if __name__ == "__main__":
    main()
