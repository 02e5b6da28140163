"""`mt release RUN`: a checkpoint as a folder a downstream user loads without mt, behind a gate.

The gate (each refusal one line, nothing written): the requirements (`[release] require` and
`--require`) on the eval at the released step; the checkpoint intact (every byte against its
manifest); no non-finite loss and no open error incident at or before its step, unless the run went
back before it afterwards (a `rollback` event, or a resume from an earlier checkpoint). The weights are written by `python -P -m engine.release` (torch lives there),
the rest here, all into a temporary folder beside DIR renamed into place at the end.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mt.contract import checkpoints
from mt.contract.config import Config, ConfigError
from mt.contract.events import parse_line
from mt.contract.jsonl import JsonlTail
from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json
from mt.contract.records import Checkpoint, Eval, RunStart, Step, parse_event
from mt.contract.release import Requirement, eval_numbers, parse_requirement
from tui.read.follower import load_run_state
from tui.read.rundir import is_run_dir

NOTHING = "nothing was written"
_STEP = re.compile(rb'\{"v":\d+,"t":[^,]*,"kind":"step",')   # a step line's envelope, as every writer writes it
_NON_FINITE = re.compile(rb'"loss":"(nan|inf|-inf)"')         # how events.dumps writes a non-finite loss


class ReleaseError(ValueError):
    """Why a release is refused: one line, naming the run or the checkpoint."""


@dataclass
class AtStep:
    """What the run's events say of the released step and the steps before it."""

    numbers: dict[str, float] = field(default_factory=dict)   # the eval at the step (the newest of them)
    evaluated: dict[str, Any] | None = None                    # that eval event as written
    samples: list[dict[str, Any]] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)           # a non-finite loss or an open error, not rolled back
    incidents: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Released:
    path: Path
    step: int
    chosen: str          # "best", "newest" or "--step"
    files: list[str]


def choose(root: Path, step: int | None) -> tuple[Path, str]:
    """The checkpoint folder to release: `step`'s, else the best kept, else the newest intact."""
    listed = dict(checkpoints.folders(root))
    if step is not None:
        if step not in listed:
            have = ", ".join(p.name for p in listed.values()) or "none"
            raise ReleaseError(f"{root}: no checkpoint step-{step} (there are: {have}); {NOTHING}")
        return listed[step], "--step"
    kept = checkpoints.best(root)
    if kept:
        return kept[0].path, "best"
    found = checkpoints.newest(root)
    if found.path is None:
        raise ReleaseError(f"{root.parent}: {found.why_none()}; {NOTHING}")
    return found.path, "newest"


def read_at(paths: RunPaths, step: int) -> AtStep:
    """The eval numbers and samples at `step`, and what precedes it that forbids a release."""
    at = AtStep()
    backs: list[tuple[float, int]] = []    # (when, to which step) the run went back: a rollback, or a resume
    problems: list[tuple[float, int, str]] = []
    saved_t = math.inf    # when this step's checkpoint was written (its newest event): later lines are another timeline
    found: list[tuple[float, dict[str, Any]]] = []   # this step's evals and samples, each with when it was written
    for line in JsonlTail(paths.events).iter_all_lines() if paths.events.exists() else ():
        if _STEP.match(line) and not _NON_FINITE.search(line):
            continue   # a step with a finite loss (most of a big run's lines): not parsed
        raw = parse_line(line)
        if raw is None:
            continue
        kind, t = raw.get("kind"), raw.get("t") if isinstance(raw.get("t"), (int, float)) else 0.0
        if kind == "rollback" and isinstance(raw.get("to_step"), int):
            backs.append((t, raw["to_step"]))
            continue
        if kind == "sample" and raw.get("step") == step:
            found.append((t, raw))
            continue
        rec = parse_event(raw)
        if isinstance(rec, RunStart) and (rec.attempt or 1) > 1:
            backs.append((t, rec.start_step))
        elif isinstance(rec, Checkpoint) and rec.step == step:
            saved_t = t
        elif isinstance(rec, Eval) and rec.step == step:
            found.append((t, raw))
        elif isinstance(rec, Step) and rec.step <= step and rec.loss is not None and not math.isfinite(rec.loss):
            problems.append((t, rec.step, f"a non-finite loss at step {rec.step}"))
    for t, raw in found:   # the newest eval, and the newest sample of each prompt, written before the checkpoint
        if t > saved_t:
            continue
        if raw.get("kind") == "eval":
            at.numbers, at.evaluated = eval_numbers(raw), raw
        else:
            at.samples = [s for s in at.samples if s.get("index") != raw.get("index")] + [raw]
    for inc in load_run_state(paths.root).incidents:
        if inc.step is not None and inc.step > step:
            continue
        at.incidents.append({"step": inc.step, "code": inc.code, "severity": inc.severity, "status": inc.status,
                             "title": inc.title, "detail": inc.detail, "source": inc.source, "t": inc.t})
        if inc.status == "open" and inc.severity == "error":
            problems.append((inc.event_t or inc.t or 0.0, inc.step or 0, f"an open error incident {inc.code} at step {inc.step}"))
    # in these weights: a problem before the checkpoint was written, unless the run went back before its
    # step in between (a rollback, or a resume from an earlier checkpoint)
    at.blockers = [why for t, s, why in problems
                   if t <= saved_t and not any(t < bt <= saved_t and to < s for bt, to in backs)]
    return at


def requirements(cfg: Config, extra: list[str]) -> list[Requirement]:
    """The preset's `[release] require` and the command's `--require`, parsed (ReleaseError if one is bad)."""
    try:
        return [parse_requirement(text) for text in [*cfg.release.require, *extra]]
    except ValueError as e:
        raise ReleaseError(f"{e}; {NOTHING}") from None


def release(run_dir: Path, step: int | None = None, to: Path | None = None, require: list[str] | None = None,
            python: str = sys.executable) -> Released:
    """Check the gate, then write the release folder (DIR: `--to`, else RUN/release/step-S); ReleaseError: refused."""
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise ReleaseError(f"{run_dir}: not a run directory (no config.json); {NOTHING}")
    paths = RunPaths(run_dir)
    try:
        cfg = load_config_json(paths.config)
    except ConfigError as e:
        raise ReleaseError(f"{e}; {NOTHING}") from None
    reqs = requirements(cfg, require or [])
    folder, chosen = choose(paths.checkpoints, step)
    try:
        manifest = checkpoints.verify(folder)
    except checkpoints.CheckpointError as e:
        raise ReleaseError(f"{e}: not intact, not released; {NOTHING}") from None
    s = int(manifest.get("step", checkpoints.step_of(folder.name) or 0))
    at = read_at(paths, s)
    if at.blockers:
        raise ReleaseError(f"{folder.name}: {at.blockers[0]} precedes it and the run did not go back before it (no rollback or resume to an earlier step); {NOTHING}")
    for req in reqs:
        unmet = req.unmet(at.numbers)
        if unmet is not None:
            raise ReleaseError(f"{folder.name}: {unmet}; {NOTHING}")
    out = Path(to) if to is not None else run_dir / "release" / folder.name
    if out.exists() or out.is_symlink():
        raise ReleaseError(f"{out}: already exists; {NOTHING}")
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        if to is None:
            out.parent.mkdir(exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise ReleaseError(f"{out}: cannot write the release: {e}; {NOTHING}") from None
    try:
        weights = _weights(python, run_dir, folder, tmp)
        _describe(tmp, cfg, run_dir, folder, s, chosen, manifest, at, reqs, weights)
        os.rename(tmp, out)    # never over an existing folder: a DIR made meanwhile is an error, not replaced
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise ReleaseError(f"{out}: cannot write the release: {e}; {NOTHING}") from None
        raise
    return Released(out, s, chosen, sorted(p.name for p in out.iterdir()))


def _weights(python: str, run_dir: Path, folder: Path, tmp: Path) -> list[str]:
    """The weights written by the engine's module (torch), into tmp; ReleaseError with its one line."""
    done = subprocess.run([python, "-P", "-m", "engine.release", "--run-dir", str(run_dir), "--checkpoint", str(folder),
                           "--out", str(tmp)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise ReleaseError(f"{folder}: the weights could not be written: {lines[-1] if lines else f'exit {done.returncode}'}; {NOTHING}")
    return json.loads(done.stdout.strip().splitlines()[-1])["files"]


def _describe(tmp: Path, cfg: Config, run_dir: Path, folder: Path, step: int, chosen: str, manifest: dict[str, Any],
              at: AtStep, reqs: list[Requirement], weights: list[str]) -> None:
    """release.json, config.json (not an HF model's: its own), eval.json, samples.json, incidents.json, README.md."""
    preset = cfg.recorded()
    hf = cfg.model.kind == "hf"
    _json(tmp / "release.json", {
        "format": "mt-release", "version": 1, "run": run_dir.name, "step": step, "chosen": chosen,
        "checkpoint": {"path": str(folder), "layout": manifest["layout"], "files": manifest["files"], "best": manifest.get("best")},
        "kind": cfg.model.kind, "requirements": [str(r) for r in reqs], "weights": weights, "preset": preset})
    if not hf:
        _json(tmp / "config.json", {"kind": cfg.model.kind, "model": preset["model"], "preset": preset})
    _json(tmp / "eval.json", {"step": step, "numbers": at.numbers, "event": at.evaluated})
    _json(tmp / "samples.json", sorted(at.samples, key=lambda s: s.get("index") or 0))
    _json(tmp / "incidents.json", at.incidents)
    (tmp / "README.md").write_text(readme(run_dir.name, step, chosen, cfg, at, reqs))


def _json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str) + "\n")


def readme(run: str, step: int, chosen: str, cfg: Config, at: AtStep, reqs: list[Requirement]) -> str:
    """How to load the release, and what it is."""
    numbers = ", ".join(f"{k} = {v:.6g}" for k, v in at.numbers.items()) or "no eval at this step"
    if cfg.model.kind == "hf":
        load = ("A Hugging Face model's own `save_pretrained` folder:\n\n```python\n"
                "from transformers import AutoModelForCausalLM\n"
                "model = AutoModelForCausalLM.from_pretrained(\"path/to/this/folder\")\n```\n")
    else:
        load = ("`model.safetensors` is the model's state dict (every tensor its own copy); `config.json` holds the\n"
                f"`[model]` table (kind `{cfg.model.kind}`) and the whole preset to rebuild the model with:\n\n```python\n"
                "from safetensors.torch import load_file\n"
                "state = load_file(\"path/to/this/folder/model.safetensors\")\n"
                "model.load_state_dict(state)   # a model built as config.json's \"model\" says\n```\n")
    gate = "; ".join(map(str, reqs)) or "none"
    return (f"# {run}, step {step}\n\nReleased by `mt release` ({chosen} checkpoint). Eval at step {step}: {numbers}.\n"
            f"Requirements met: {gate}.\n\n## Loading it\n\n{load}\n## Files\n\n"
            "- `release.json`: the run, the step, the checkpoint's manifest (file hashes), the preset\n"
            "- `eval.json`: the eval numbers at this step; `samples.json`: the generated samples at this step\n"
            "- `incidents.json`: the run's incidents up to this step\n")
