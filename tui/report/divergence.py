"""`mt diff A B --first-divergence`: where two runs part, and which tensors of their checkpoints
around that step differ (compared by `python -P -m engine.checkpoint.compare`: tui never imports torch)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mt.contract import door
from mt.contract.checkpoints import CheckpointError, folders, verify
from mt.contract.paths import RunPaths
from tui.format.fmt import NA, safe_text
from tui.read.follower import RunFollower
from tui.report.diff import DiffError
from tui.state.divergence import Divergence, Gap, first_divergence
from tui.state.runseries import RunSeries

COMPARE_TIMEOUT_S = 1800.0   # two checkpoints hashed and loaded whole: minutes for a model of billions
SHOWN_TENSORS = 8            # tensor lines per checkpoint pair; the count says how many more


def read_series(run_dir: Path) -> RunSeries:
    """The run's reduced values (the viewer's one reducer); DiffError when it logged none."""
    paths = RunPaths(Path(run_dir))
    if not door.is_regular(paths.events):
        raise DiffError(f"{paths.events}: no events to compare (the run never started)")
    follower = RunFollower(paths.root)
    follower.poll()
    series = follower.series
    assert series is not None
    if not any(len(s) for s in (*series.all().values(), *series.extra.values())):
        raise DiffError(f"{paths.events}: no logged step to compare")
    return series


def usable_checkpoints(run_dir: Path, series: RunSeries) -> dict[int, Path]:
    """step -> folder of the run's checkpoints (sizes as listed) that belong to the steps it kept:
    one written before a rewind to an earlier step (a resume, a rollback) is an abandoned timeline's."""
    out = {}
    for step, folder in folders(RunPaths(Path(run_dir)).checkpoints, verified="sizes"):
        try:
            created = verify(folder, hashes=False).get("created")
        except CheckpointError:
            continue
        created = created if isinstance(created, (int, float)) else None
        if created is None or not any(t is not None and to < step and t > created for t, to in series.rewinds):
            out[step] = folder
    return out


@dataclass(frozen=True)
class TensorCheck:
    """One pair of checkpoints compared: the step, which side of the divergence, and the engine's answer."""

    step: int
    where: str                      # "at or before" / "after"
    result: dict[str, Any]          # engine.checkpoint.compare's JSON ({"error": ...} when it could not)


def compare_folders(a: Path, b: Path) -> dict[str, Any]:
    """The engine's comparison of two checkpoint folders, or {"error": why}."""
    cmd = [sys.executable, "-P", "-m", "engine.checkpoint.compare", str(a), str(b)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPARE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"the comparison did not finish: {type(e).__name__}"}
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the comparison failed (exit {proc.returncode}): {tail}"}
    return out if isinstance(out, dict) else {"error": "the comparison said nothing readable"}


def tensor_checks(div: Divergence, ck_a: dict[int, Path], ck_b: dict[int, Path]) -> list[TensorCheck]:
    """The newest common checkpoint at or before the divergence and the first after it, compared."""
    if div.step is None:
        return []
    common = sorted(ck_a.keys() & ck_b.keys())
    before = [s for s in common if s <= div.step][-1:]
    after = [s for s in common if s > div.step][:1]
    return [TensorCheck(s, where, compare_folders(ck_a[s], ck_b[s]))
            for s, where in [*((s, "at or before") for s in before), *((s, "after") for s in after)]]


def divergence_text(run_a: Path, run_b: Path) -> str:
    """The whole `--first-divergence` report; DiffError when a run has nothing to compare."""
    sa, sb = read_series(run_a), read_series(run_b)
    div = first_divergence(sa, sb)
    lines = [divergence_head(div)]
    lines += [gap_line(g) for g in div.gaps]
    if div.step is not None:
        checks = tensor_checks(div, usable_checkpoints(run_a, sa), usable_checkpoints(run_b, sb))
        if not checks:
            lines.append(f"checkpoints: none both runs kept at a common step around step {div.step}")
        for check in checks:
            lines += check_lines(check)
    return "\n".join(lines)


def divergence_head(div: Divergence) -> str:
    """The verdict line: where they part (and the last step they agreed), or how far they agree."""
    what = f"compared: {', '.join(div.names) or 'nothing'} at {div.compared} step{'s' * (div.compared != 1)} both logged"
    if div.last_common is None:
        return f"no step both runs logged ({what})"
    if div.step is None:
        more = [f"{side} logged to step {last}" for side, last in (("A", div.last_a), ("B", div.last_b))
                if last is not None and last > div.last_common]
        return f"identical through step {div.last_common} (the last both logged; {what}{''.join('; ' + m for m in more)})"
    equal = f"equal through step {div.last_equal}" if div.last_equal is not None else "no earlier step compared"
    return f"first divergence: step {div.step} ({equal}; {what})"


def gap_line(g: Gap) -> str:
    rel = g.rel_diff
    return (f"  {safe_text(g.name)}: A {g.a!r}  B {g.b!r}  |A-B| {_g(g.abs_diff)}"
            f"  relative {_g(rel) if not math.isnan(rel) else NA}")


def _g(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def check_lines(check: TensorCheck) -> list[str]:
    """A checkpoint pair's lines: identical, or the tensors that differ in the model's order."""
    head = f"checkpoint step-{check.step} ({check.where} the divergence):"
    r = check.result
    if "error" in r:
        return [f"{head} not compared: {safe_text(r['error'])}"]
    differ = r.get("differ") or []
    odd = [f"{len(r.get(k) or [])} {what}" for k, what in (("only_a", "only in A"), ("only_b", "only in B"),
                                                          ("mismatched", "of another shape or dtype")) if r.get(k)]
    tail = f" ({', '.join(odd)})" if odd else ""
    if not differ:
        return [f"{head} identical ({r.get('tensors', 0)} tensors){tail}"]
    out = [f"{head} {len(differ)} of {r.get('tensors', 0)} tensors differ{tail}, in the model's order:"]
    width = max(len(str(d.get("name"))) for d in differ[:SHOWN_TENSORS])
    for d in differ[:SHOWN_TENSORS]:
        out.append(f"  {safe_text(d.get('name')).ljust(width)}  max |A-B| {_g(float(d.get('max_abs_diff', math.nan)))}"
                   f"  ({d.get('values_differ')} of {d.get('values')} values)")
    if len(differ) > SHOWN_TENSORS:
        out.append(f"  ... and {len(differ) - SHOWN_TENSORS} more")
    return out
