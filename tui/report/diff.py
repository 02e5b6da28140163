"""`mt diff RUN_A RUN_B`: the resolved config keys that differ, world size and losses, as text."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mt.contract import door
from mt.contract.events import JSON_ERRORS
from mt.contract.paths import RunPaths
from tui.format.fmt import NA, fmt_best, fmt_loss_cell, safe_text
from tui.read.follower import load_run_state
from tui.state.runstate import RunState

MISSING = "(missing)"


class DiffError(ValueError):
    """A run whose config cannot be read; str() is the one line for the user."""


def flatten(cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys ({"train": {"lr": 1}} -> {"train.lr": 1}); lists stay values."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(dotted key, A's value, B's value) for every key whose values differ, sorted by key."""
    fa, fb = flatten(a), flatten(b)
    rows = []
    for key in sorted(fa.keys() | fb.keys()):
        va, vb = fa.get(key, MISSING), fb.get(key, MISSING)
        if va != vb or type(va) is not type(vb):   # 1 and 1.0 are different settings in a preset
            rows.append((key, _value(va), _value(vb)))
    return rows


def _value(v: Any) -> str:
    return v if v is MISSING else json.dumps(v)


def read_config(run_dir: Path) -> dict[str, Any]:
    """The resolved config the run recorded: config.json (mt launch writes it before training)."""
    path = RunPaths(Path(run_dir)).config
    try:
        cfg = json.loads(door.read_bytes(path, door.SMALL_JSON))
    except FileNotFoundError:
        raise DiffError(f"{run_dir}: not an mt run directory (no config.json)") from None
    except (OSError, *JSON_ERRORS) as e:
        why = str(e).removeprefix(f"{path}: ") if isinstance(e, door.Refused) else type(e).__name__
        raise DiffError(f"{path}: cannot read the run's config ({why})") from None
    if not isinstance(cfg, dict):
        raise DiffError(f"{path}: not a config (expected a JSON object)")
    if _depth(cfg) > MAX_DEPTH:
        raise DiffError(f"{path}: not a config (nested deeper than {MAX_DEPTH} levels)")
    return cfg


MAX_DEPTH = 32   # mt writes 3; comparing deeper values would recurse past Python's limit


def _depth(obj: Any) -> int:
    """How deeply lists and objects nest in `obj` (without recursion)."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:
                todo += [(c, d + 1) for c in (v.values() if isinstance(v, dict) else v)]
    return deepest


@dataclass
class DiffColumn:
    """One run's column of `mt diff` beside the config keys: its name, world size and losses."""

    name: str
    world: str
    final: str
    best: str


def diff_column(run_dir: Path, cfg: dict[str, Any], st: RunState | None = None) -> DiffColumn:
    st = st or load_run_state(Path(run_dir))
    return DiffColumn(Path(run_dir).name, _world(st, cfg), fmt_loss_cell(st.loss),
                    fmt_best(st.best_loss, st.best_loss_step, st.best_loss_partial))


def _world(st: RunState, cfg: dict[str, Any]) -> str:
    """The world the run trained on (run_start), else what its config asks for (not started yet)."""
    if st.world_size is not None:
        return str(st.world_size)
    launch = cfg.get("launch") if isinstance(cfg.get("launch"), dict) else {}
    nproc, nnodes = launch.get("nproc_per_node"), launch.get("nnodes", 1)
    if isinstance(nproc, int) and isinstance(nnodes, int):
        return f"{nproc * nnodes} (config; not started)"
    return NA


def diff_text(run_a: Path, run_b: Path) -> str:
    """The whole `mt diff` report; DiffError when a run's config cannot be read."""
    cfg_a, cfg_b = read_config(run_a), read_config(run_b)
    st_a, st_b = load_run_state(Path(run_a)), load_run_state(Path(run_b))
    fa, fb = diff_column(run_a, cfg_a, st_a), diff_column(run_b, cfg_b, st_b)
    # a script's hyperparameters are its own (run_start's config: mt.init's, a Trainer's arguments), as `args.*`
    cfg_a, cfg_b = ({**cfg, "args": st.args} if st.args and _depth(st.args) < MAX_DEPTH else cfg
                    for cfg, st in ((cfg_a, st_a), (cfg_b, st_b)))
    keys = config_diff(cfg_a, cfg_b)
    rows = [("", fa.name, fb.name), *keys, ("world size", fa.world, fb.world),
            ("final loss", fa.final, fb.final), ("best loss", fa.best, fb.best)]
    rows = [tuple(safe_text(c) for c in r) for r in rows]   # keys and names come from the runs
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    n = len(keys)
    head = f"config: {n} key{' differs' if n == 1 else 's differ'}" if n else "config: identical"
    return "\n".join([f"A: {safe_text(run_a)}", f"B: {safe_text(run_b)}", head,
                      *("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)])
