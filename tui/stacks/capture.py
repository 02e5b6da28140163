"""Take every rank's stacks on this node now: SIGUSR2 (faulthandler into the rank log), else py-spy.

A capture is kept as RUN/stacks/<UTC time>-<why>/rank<N>.txt (the raw dump) and verdict.json
(docs/run-directory.md). Nothing here runs until someone asks for a capture.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from mt.contract import door
from mt.contract.paths import RunPaths
from mt.contract.status import read_status
from mt.stacks import DUMP_SIGNAL
from tui.diagnose.probes import file_size
from tui.read.rundir import require_run_dir
from tui.stacks.ranks import NoRanksError, find_ranks, ranks_of_pid
from tui.stacks.verdict import Frame, Place, RankStack, Verdict, parse_faulthandler, parse_py_spy, place_of, verdict

__all__ = ["NoRanksError", "find_ranks", "ranks_of_pid", "capture", "capture_ranks", "py_spy"]

_POLL_S = 0.02
_SPY_TIMEOUT_S = 10.0
PY_SPY_HINT = "py-spy would read it without a signal handler: pip install 'mt[stacks]'"
WORKER_HINT = "py-spy reads DataLoader workers (they are never signalled): pip install 'mt[stacks]'"


@dataclass(frozen=True)
class WorkerStack:
    """One DataLoader worker of a rank, read by py-spy: where its main thread is (None: no stack, see note)."""

    rank: int
    pid: int
    place: Place | None
    item: Frame | None = None   # the dataset's `__getitem__` frame when the place is below it
    note: str = ""

    def line(self) -> str:
        """`rank 1's DataLoader worker 4242 is in `slow_item` (my_data.py:149) under `__getitem__` (my_data.py:144)`."""
        who = f"rank {self.rank}'s DataLoader worker {self.pid}"
        if self.place is None:
            return f"{who}: no stack ({self.note})"
        under = f" under `{self.item.func}` ({self.item.where()})" if self.item and self.item != self.place.frame else ""
        return f"{who} {self.place.describe(False)}{under}"


@dataclass(frozen=True)
class Capture:
    """One capture: where it was kept, every rank's stacks, the verdict, and how long it took."""

    folder: Path | None   # None: printed only (`mt stacks --pid` without --out)
    stacks: tuple[RankStack, ...]
    verdict: Verdict
    seconds: float
    workers: tuple[WorkerStack, ...] = ()


def py_spy() -> str | None:
    """The py-spy binary: on PATH, or beside this interpreter (the `stacks` extra installs it there)."""
    found = shutil.which("py-spy")
    beside = Path(sys.executable).parent / "py-spy"
    return found or (str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None)


def catches_dump_signal(pid: int) -> bool:
    """Whether the process handles SIGUSR2 (SigCgt): an unhandled one would end it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next((line.split()[1] for line in f if line.startswith("SigCgt:")), "0")
        return bool(int(caught, 16) >> (DUMP_SIGNAL - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False


DUMP_MAX_BYTES = 8 << 20
"""At most this much of what a rank log gained after its stack dump is read (a dump is KiBs)."""


def _read_from(path: Path, offset: int) -> str:
    try:
        with door.open_file(path) as f:
            f.seek(offset)
            return f.read(DUMP_MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def _signal_dumps(paths: RunPaths, ranks: dict[int, psutil.Process], wait_s: float) -> dict[int, str]:
    """SIGUSR2 to every rank that handles it; what each rank log gained once its dump stopped growing."""
    start = {r: file_size(paths.rank_log(r)) for r in ranks}
    sent = []
    for rank, proc in ranks.items():
        if catches_dump_signal(proc.pid):
            try:
                proc.send_signal(DUMP_SIGNAL)
                sent.append(rank)
            except psutil.Error:
                pass
    got: dict[int, str] = {}
    last = {r: start[r] for r in sent}
    deadline = time.monotonic() + wait_s
    while len(got) < len(sent) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        for rank in sent:
            size = file_size(paths.rank_log(rank))
            # complete when it holds a thread block and did not grow over one poll
            if rank not in got and size == last[rank] > start[rank]:
                text = _read_from(paths.rank_log(rank), start[rank])
                if parse_faulthandler(text):
                    got[rank] = text
            last[rank] = size
    for rank in sent:  # a rank that never stopped printing: its dump is in there all the same
        text = _read_from(paths.rank_log(rank), start[rank]) if rank not in got else ""
        if text and parse_faulthandler(text):
            got[rank] = text
    return got


def _spy(binary: str, pid: int) -> tuple[str, str]:
    """(py-spy's dump, '') or ('', why it gave none)."""
    try:
        out = subprocess.run([binary, "dump", "--pid", str(pid), "--nonblocking", "--full-filenames"],
                             capture_output=True, text=True, timeout=_SPY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "", f"py-spy failed: {e}"
    if out.returncode != 0 or not parse_py_spy(out.stdout):
        why = (out.stderr.strip().splitlines() or ["no stack"])[-1][:300]
        return "", f"py-spy failed ({why}); it needs ptrace rights over the process (same user, ptrace_scope 0, or root)"
    return out.stdout, ""


def _folder(parent: Path, why: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for i in range(1, 1000):
        folder = parent / (f"{stamp}-{why}" if i == 1 else f"{stamp}-{why}.{i}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"no free capture folder for {stamp}-{why}")


def _workers(ranks: dict[int, psutil.Process], binary: str | None) -> list[tuple[WorkerStack, str]]:
    """Each rank's DataLoader workers (its children carrying RANK) by py-spy, with the raw dump.

    Never by signal: a forked worker inherits the rank's SIGUSR2 handler and its stderr, so its
    dump would land in the rank's log mixed with the rank's own, and a spawned one has no handler
    at all (SIGUSR2 would end it, and the DataLoader would fail the step)."""
    out: list[tuple[WorkerStack, str]] = []
    for rank, proc in sorted(ranks.items()):
        try:
            kids = [c for c in proc.children() if "RANK" in c.environ()]
        except psutil.Error:
            continue
        for kid in kids:
            if binary is None:
                out.append((WorkerStack(rank, kid.pid, None, note=WORKER_HINT), ""))
                continue
            text, failed = _spy(binary, kid.pid)
            main = next((t for t in parse_py_spy(text) if t.main), None)
            item = next((f for f in main.frames if f.func.rsplit(".", 1)[-1] == "__getitem__"), None) if main else None
            out.append((WorkerStack(rank, kid.pid, place_of(main) if main else None, item, failed), text))
    return out


def capture(run_dir: Path, why: str = "request", wait_s: float = 2.0, workers: bool = False,
            node: str | None = None, request: str = "") -> Capture:
    """Every rank's stacks on this node now (and with `workers`, their DataLoader workers'), kept under
    the node's stacks/; NotARunError / NoRanksError when there is nothing to take."""
    run_dir = require_run_dir(Path(run_dir)).resolve()
    t0 = time.monotonic()
    paths = RunPaths(run_dir, node)
    ranks = find_ranks(run_dir, node)
    if not ranks:
        raise NoRanksError(f"{run_dir}: no live rank process of this run on this node")
    # a script's own run (mt.init under plain torchrun) has no rank logs: its dump would go to the terminal
    logs = None if read_status(run_dir, node).by_script else paths
    return capture_ranks(ranks, paths.stacks, why, wait_s, workers, logs, request, t0)


def capture_ranks(ranks: dict[int, psutil.Process], into: Path | None, why: str = "request", wait_s: float = 2.0,
                  workers: bool = False, logs: RunPaths | None = None, request: str = "",
                  t0: float | None = None) -> Capture:
    """These ranks' stacks: by SIGUSR2 into their logs under `logs` (None: py-spy only), kept in a new
    folder under `into` (None: kept nowhere)."""
    t0 = time.monotonic() if t0 is None else t0
    dumps = _signal_dumps(logs, ranks, wait_s) if logs is not None else {}
    binary = py_spy()
    stacks, raw = [], {}
    for rank, proc in sorted(ranks.items()):
        if rank in dumps:
            raw[rank] = dumps[rank]
            stacks.append(RankStack(rank, proc.pid, "faulthandler", tuple(parse_faulthandler(dumps[rank]))))
            continue
        handled = catches_dump_signal(proc.pid)
        if logs is None:
            lack = "no rank log to read a SIGUSR2 dump from"
        else:
            lack = f"no dump within {wait_s:g} s of SIGUSR2" if handled else "no SIGUSR2 handler (no mt in the script)"
        if binary is None:
            stacks.append(RankStack(rank, proc.pid, "none", note=f"{lack}; {PY_SPY_HINT}"))
            continue
        text, failed = _spy(binary, proc.pid)
        raw[rank] = text
        stacks.append(RankStack(rank, proc.pid, "py-spy" if text else "none",
                                tuple(parse_py_spy(text)), f"{lack}; {failed}" if failed else lack))
    found = verdict(stacks)
    loaders = _workers(ranks, binary) if workers else []
    seconds = time.monotonic() - t0
    folder = _folder(into, f"{why}-{request}" if request else why) if into is not None else None
    if folder is not None:
        for rank, text in raw.items():
            (folder / f"rank{rank}.txt").write_text(text)
        for w, text in loaders:
            if text:
                (folder / f"rank{w.rank}-worker{w.pid}.txt").write_text(text)
        kept = verdict_record(found, stacks, why, seconds)
        if request:
            kept["request"] = request
        if workers:
            kept["workers"] = [{"rank": w.rank, "pid": w.pid, "line": w.line(), "func": w.place and w.place.frame.func,
                                "file": w.place and w.place.frame.file, "line_no": w.place and w.place.frame.line,
                                "item": w.item and w.item.where(), "note": w.note} for w, _ in loaders]
        (folder / "verdict.json").write_text(json.dumps(kept, indent=1) + "\n")
    return Capture(folder, tuple(stacks), found, seconds, tuple(w for w, _ in loaders))


def verdict_record(found: Verdict, stacks: list[RankStack], why: str, seconds: float) -> dict[str, object]:
    """verdict.json: the line, the groups (odd one first), each rank's path and place."""
    def place(s: RankStack) -> dict[str, object] | None:
        main = s.main_thread()
        p = place_of(main) if main else None
        return None if p is None else {"file": p.frame.file, "line": p.frame.line, "func": p.frame.func,
                                       "waits_in": p.waits_in}

    return {
        "v": 1, "t": time.time(), "why": why, "capture_s": round(seconds, 4), "line": found.line,
        "groups": [{"ranks": list(g.ranks), "file": g.place.frame.file, "line": g.place.frame.line,
                    "func": g.place.frame.func, "waits_in": g.place.waits_in} for g in found.groups],
        "missing": list(found.missing),
        "ranks": {str(s.rank): {"pid": s.pid, "source": s.source, "threads": len(s.threads), "note": s.note,
                                "place": place(s)} for s in stacks},
    }
