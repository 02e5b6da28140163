"""Incident diagnostics scorecard: does each injected fault get named, how fast, any false alarms?

Runs the tiny CPU model for real under `mt launch` once per fault (stall, NaN, crash, hang,
hang left to time out) and several times clean, then prints per fault: detected, code, step,
latency from the fault to the line in incidents.jsonl, and warn/error incidents on clean runs.
A second, synthetic part runs the engine-side loss/grad rules over many generated curves.

    .venv/bin/python bench/diagnose_scorecard.py [--clean 3] [--only stall,nan] [--skip-runs]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mt.contract.config import MonitorConfig
from mt.rules import StepRules
from tests.diagnose.scenarios import CLEAN, FAULTS, MONITOR, Outcome, Scenario, launch
from tests.diagnose.streams import steps as synthetic_steps


def fault_rows(outcomes: list[tuple[Scenario, Outcome]]) -> list[dict[str, Any]]:
    rows = []
    for scn, o in outcomes:
        for code, key in scn.expect.items():
            hit = o.first(code)
            want_step = scn.faults[key]
            rows.append({
                "fault": f"{scn.name}: {key}={want_step}", "expected": code, "detected": hit is not None,
                "step": hit["step"] if hit else None, "right_step": bool(hit and hit["step"] == want_step),
                "latency_s": None if o.latency_s(code) is None else round(o.latency_s(code), 1),
                "steps_late": o.steps_late(code),
                "other_alarms": sorted({f"{r['code']}/{r['severity']}" for r in o.alarms()} - {f"{c}/{o.first(c)['severity']}" for c in scn.expect if o.first(c)}),
                "run_state": o.state, "wall_s": round(o.wall_s, 1),
            })
    return rows


def clean_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    return [{"run": o.run_dir.name, "state": o.state, "false_alarms": [f"{r['code']}/{r['severity']}" for r in o.alarms()],
             "info": [r["code"] for r in o.incidents if r.get("status") == "open" and r.get("severity") == "info"],
             "wall_s": round(o.wall_s, 1)} for o in outcomes]


def synthetic(n: int = 200, seed: int = 0) -> dict[str, Any]:
    """Engine-side rules on generated loss/grad curves: false alarms on clean ones, hits on faults."""
    m = MonitorConfig()
    rng = random.Random(seed)
    clean_alarms = spikes_hit = spikes_right = grads_hit = 0
    for i in range(n):
        noise = rng.choice([0.02, 0.04, 0.08])
        stream = synthetic_steps(300, seed * 100_000 + i, noise=noise)
        sa = StepRules(m, 1.0)
        clean_alarms += sum(len(sa.observe(s)) for s in stream)
        at = rng.randint(m.spike_min_history + 40, 280)
        spiked = [dict(s) for s in stream]
        spiked[at - 1]["loss"] *= rng.uniform(2.0, 4.0)
        sa = StepRules(m, 1.0)
        got = [inc for s in spiked for inc in sa.observe(s)]
        spikes_hit += any(g.code == "loss_spike" for g in got)
        spikes_right += [(g.code, g.step) for g in got] == [("loss_spike", at)]
        exploded = [dict(s) for s in stream]
        exploded[at - 1]["grad_norm"] = stream[at - 1]["grad_norm"] * rng.uniform(30, 100)
        sa = StepRules(m, 1.0)
        grads_hit += any(g.code == "grad_explosion" and g.step == at for s in exploded for g in sa.observe(s))
    return {"curves": n, "clean_false_alarms": clean_alarms, "spike_2-4x_detected": spikes_hit,
            "spike_exact_step_only": spikes_right, "grad_30-100x_detected": grads_hit}


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    cells = [[str(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clean", type=int, default=3, help="clean runs to count false alarms on")
    ap.add_argument("--only", default="", help="comma-separated fault scenarios (default: all)")
    ap.add_argument("--skip-runs", action="store_true", help="only the synthetic part")
    ap.add_argument("--out", type=Path, default=None, help="where run directories go (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="mt-scorecard-"))
    result: dict[str, Any] = {"monitor_overrides": MONITOR}
    ok = True
    if not args.skip_runs:
        chosen = [s for s in FAULTS if not args.only or s.name in args.only.split(",")]
        faults = [(s, launch(s, out / s.name)) for s in chosen]
        cleans = [launch(CLEAN, out / f"clean{i}") for i in range(args.clean)]
        frows, crows = fault_rows(faults), clean_rows(cleans)
        result.update(faults=frows, clean=crows)
        print(f"Fault scenarios (tiny CPU GPT, 2 ranks, [monitor] {MONITOR}); latency = fault -> incidents.jsonl\n")
        print(table(frows, ["fault", "expected", "detected", "step", "right_step", "latency_s", "steps_late", "other_alarms", "run_state"]))
        print(f"\nClean runs ({len(crows)}): warn/error incidents = {sum(len(r['false_alarms']) for r in crows)}\n")
        print(table(crows, ["run", "state", "false_alarms", "info", "wall_s"]))
        ok = (all(r["detected"] and r["right_step"] and not r["other_alarms"] for r in frows)
              and not any(r["false_alarms"] for r in crows))
    syn = synthetic()
    result["synthetic"] = syn
    print("\nEngine-side rules on synthetic curves (300 steps, fall + noise, warmup, clipping):")
    print("  " + ", ".join(f"{k} {v}" for k, v in syn.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(f"\nrun directories: {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
