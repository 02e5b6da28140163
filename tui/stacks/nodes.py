"""Stacks across the nodes of a job's shared run directory: a request every node's supervisor answers
with a capture of its own ranks (into nodes/<node>/stacks/), and the verdict over all of them.

A request is control/.stacks/<id>.json, written once by whoever asks; a node's answer is its capture
folder `<UTC>-<why>-<id>` under its own stacks/ (one writer per file: the requester, each supervisor).
"""
from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mt.contract.jsonl import read_json, write_json_atomic
from mt.contract.paths import RunPaths, node_name_ok
from tui.read.rundir import require_run_dir
from tui.read.wait import poll_until
from tui.stacks.capture import Capture, capture
from tui.stacks.verdict import Frame, Place, Verdict, verdict_of_places

_REQUEST_ID = len("20260101T000000Z-") + 6


def request_stacks(run_dir: Path, workers: bool = False) -> str:
    """Ask every node's supervisor for a capture now; the request's id."""
    rid = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"
    folder = RunPaths(Path(run_dir)).stack_requests
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_json_atomic(folder / f"{rid}.json", {"v": 1, "id": rid, "t": time.time(), "workers": workers})
    return rid


@dataclass(frozen=True)
class StackRequest:
    """One request for every node's capture: its id and whether DataLoader workers are wanted too."""

    id: str
    t: float
    workers: bool


def pending_requests(paths: RunPaths, since: float, taken: frozenset[str] = frozenset()) -> list[StackRequest]:
    """Requests made since `since` that this node (paths.node) has not answered yet, oldest first;
    `taken`: ids already answered (their files are not read again); files that are not requests are skipped."""
    # an id starts with its UTC second: older files are passed over by name, unread
    floor = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(since - 1))
    try:
        names = sorted(e.name for e in os.scandir(paths.stack_requests)
                       if e.name.endswith(".json") and e.name >= floor and e.name[:-5] not in taken)
    except OSError:
        return []
    out = []
    for name in names:
        raw = read_json(paths.stack_requests / name)
        rid = raw.get("id") if isinstance(raw, dict) else None
        t = raw.get("t") if isinstance(raw, dict) else None
        if not (isinstance(rid, str) and len(rid) == _REQUEST_ID and node_name_ok(rid) and name == f"{rid}.json"
                and isinstance(t, (int, float)) and t >= since):
            continue
        if answer_of(paths, rid) is None:
            out.append(StackRequest(rid, float(t), raw.get("workers") is True))
    return out


def answer_of(paths: RunPaths, rid: str) -> Path | None:
    """This node's capture folder for request `rid`, if it took one."""
    try:
        found = [e.path for e in os.scandir(paths.stacks) if e.name.endswith(f"-{rid}") and e.is_dir()]
    except OSError:
        return None
    return Path(max(found)) if found else None


def _place(raw: Any) -> Place | None:
    """A rank's place as verdict.json keeps it; None for anything else."""
    if not isinstance(raw, dict):
        return None
    file, line, func, waits = raw.get("file"), raw.get("line"), raw.get("func"), raw.get("waits_in")
    if not (isinstance(file, str) and isinstance(line, int) and isinstance(func, str)
            and (waits is None or isinstance(waits, str))):
        return None
    return Place(Frame(file, line, func), waits)


@dataclass(frozen=True)
class NodesVerdict:
    """The verdict over every node's capture of one request: which node each rank is on, each
    node's folder, and the nodes that gave none."""

    verdict: Verdict
    node_of: dict[int, str]
    folders: dict[str, Path]
    silent: tuple[str, ...]


def nodes_verdict(run_dir: Path, rid: str) -> NodesVerdict:
    """Read every node's capture of request `rid` (verdict.json) and group the ranks across nodes."""
    top = RunPaths(Path(run_dir))
    places: dict[int, Place | None] = {}
    node_of: dict[int, str] = {}
    folders: dict[str, Path] = {}
    silent = []
    for node in top.node_names():
        folder = answer_of(top.on(node), rid)
        kept = read_json(folder / "verdict.json") if folder else None
        ranks = kept.get("ranks") if isinstance(kept, dict) else None
        if folder is None or not isinstance(ranks, dict):
            silent.append(node)
            continue
        folders[node] = folder
        for key, rec in ranks.items():
            if isinstance(key, str) and key.isdigit():
                places[int(key)] = _place(rec.get("place") if isinstance(rec, dict) else None)
                node_of[int(key)] = node
    return NodesVerdict(verdict_of_places(places), node_of, folders, tuple(silent))


def gather(run_dir: Path, rid: str, timeout: float, poll_s: float = 0.2) -> NodesVerdict:
    """Wait until every node has answered request `rid` (or `timeout` seconds), then the verdict."""
    return poll_until(lambda: nodes_verdict(run_dir, rid), timeout, poll_s, done=lambda found: not found.silent)


def nodes_record(found: NodesVerdict) -> dict[str, Any]:
    """What an incident or `--json` keeps of it: the line, the groups with their nodes, the silent nodes."""
    return {"verdict": found.verdict.line,
            "groups": [{"ranks": list(g.ranks), "nodes": sorted({found.node_of[r] for r in g.ranks}),
                        "func": g.place.frame.func, "where": g.place.frame.where(), "waits_in": g.place.waits_in}
                       for g in found.verdict.groups],
            "folders": {n: str(p) for n, p in found.folders.items()}, "silent_nodes": list(found.silent)}


def capture_everywhere(run_dir: Path, timeout: float = 15.0) -> Capture | NodesVerdict:
    """Every rank's stacks now: this machine's capture, or in a job's shared run directory every node's
    answer to one request (waiting up to `timeout`); NotARunError / NoRanksError as `capture`."""
    if RunPaths(require_run_dir(Path(run_dir))).node_names():
        return gather(run_dir, request_stacks(run_dir, workers=False), timeout)
    return capture(run_dir)
