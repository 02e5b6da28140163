"""Every rank's stacks, parsed (faulthandler's dump or py-spy's), and the verdict: which rank holds the others (pure).

The place of a rank: the innermost frame of its main thread that is the user's own code: not in
the standard library or site-packages (torch, threading, ...), not in mt's library or tui. A rank
with no such frame (mt's engine waiting in a collective) is placed at the innermost frame in mt's
engine; a stack with neither, at its innermost frame. Ranks at the same place form a group.
"""
from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Source = Literal["faulthandler", "py-spy", "none"]

_FH_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_SPY_HEADER = re.compile(r'^Thread (\S+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_SPY_FRAME = re.compile(r"^\s+(.+?) \((.+):(\d+)\)\s*$")
# frames that only pass a call on: the collective a rank waits in is the first frame past them
_WRAPPERS = {"wrapper", "_fn", "inner", "decorate_context", "__call__", "_call_impl", "_wrapped_call_impl"}
_MT_ROOT = Path(__file__).resolve().parents[2]
_LIB_DIRS = tuple(sorted({os.path.realpath(p) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")
                          if (p := sysconfig.get_paths().get(k))}))


@dataclass(frozen=True)
class Frame:
    """One Python frame: where and in which function."""

    file: str
    line: int
    func: str

    def where(self) -> str:
        """`file:line` with the file short: engine/train.py for mt's own tree, else the file's name."""
        short = Path(self.file).name
        if kind_of(self.file) in ("mt", "engine"):
            short = os.path.relpath(os.path.realpath(self.file), _MT_ROOT)
        return f"{short}:{self.line}"


@dataclass(frozen=True)
class ThreadStack:
    """One thread's frames, innermost first; `main`: the thread that runs the script."""

    ident: str
    frames: tuple[Frame, ...]
    main: bool = False
    name: str | None = None


@dataclass(frozen=True)
class RankStack:
    """What one rank's capture gave: its threads, where they came from, and why there are none."""

    rank: int
    pid: int
    source: Source
    threads: tuple[ThreadStack, ...] = ()
    note: str = ""

    def main_thread(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), None)


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """The threads of faulthandler dumps in text (other log lines around them are skipped)."""
    blocks: list[tuple[str, bool, list[Frame]]] = []
    current: list[Frame] | None = None
    for line in text.splitlines():
        head = _FH_HEADER.match(line)
        if head:
            current = []
            blocks.append((head.group(2), head.group(1) == "Current thread", current))
            continue
        frame = _FH_FRAME.match(line)
        if frame and current is not None:
            current.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
        elif current is not None and line.strip() not in ("...", "<no Python frame>"):
            current = None  # the block ended: a later line is the rank's own output
    threads = [ThreadStack(ident, tuple(frames), name="current" if cur else None) for ident, cur, frames in blocks]
    return _mark_main(threads, [cur for _, cur, _ in blocks])


def _mark_main(threads: list[ThreadStack], current: list[bool]) -> list[ThreadStack]:
    """faulthandler names no thread: the main one is the one not started by threading (`_bootstrap`)."""
    own = [i for i, t in enumerate(threads) if not (t.frames and t.frames[-1].func == "_bootstrap"
                                                     and Path(t.frames[-1].file).name == "threading.py")]
    pick = next((i for i in own if current[i]), own[0] if own else None)
    return [ThreadStack(t.ident, t.frames, i == pick, None) for i, t in enumerate(threads)]


def parse_py_spy(text: str) -> list[ThreadStack]:
    """The threads of `py-spy dump` output (frames `func (file:line)`, innermost first)."""
    threads: list[tuple[str, str | None, list[Frame]]] = []
    for line in text.splitlines():
        head = _SPY_HEADER.match(line)
        if head:
            threads.append((head.group(1), head.group(3), []))
            continue
        frame = _SPY_FRAME.match(line)
        if frame and threads:
            threads[-1][2].append(Frame(frame.group(2), int(frame.group(3)), frame.group(1)))
    main = next((i for i, t in enumerate(threads) if t[1] == "MainThread"), 0 if threads else None)
    return [ThreadStack(ident, tuple(frames), i == main, name) for i, (ident, name, frames) in enumerate(threads)]


def kind_of(file: str) -> Literal["lib", "mt", "engine", "user"]:
    """lib: standard library and site-packages (torch, threading); mt: mt's library and tui; engine: mt's engine."""
    if file.startswith("<") or "/site-packages/" in file or "/dist-packages/" in file:
        return "lib"
    real = os.path.realpath(file) if os.path.isabs(file) else file
    if real.startswith(_LIB_DIRS):
        return "lib"
    for part in ("mt", "tui", "engine"):
        if real.startswith(str(_MT_ROOT / part) + os.sep):
            return "engine" if part == "engine" else "mt"
    return "user"


@dataclass(frozen=True)
class Place:
    """Where a rank is: its innermost user frame, and the call it waits in there (None: it runs that frame)."""

    frame: Frame
    waits_in: str | None

    def key(self) -> tuple[str, int, str]:
        return self.frame.file, self.frame.line, self.frame.func

    def describe(self, plural: bool) -> str:
        if self.waits_in:
            return f"{'wait' if plural else 'waits'} in `{self.waits_in}` ({self.frame.where()})"
        return f"{'are' if plural else 'is'} in `{self.frame.func}` ({self.frame.where()})"


def place_of(thread: ThreadStack) -> Place | None:
    """The innermost user frame (else engine frame, else innermost frame) and the call it waits in."""
    frames = thread.frames
    if not frames:
        return None
    kinds = [kind_of(f.file) for f in frames]
    at = next((i for i, k in enumerate(kinds) if k == "user"), None)
    if at is None:
        at = next((i for i, k in enumerate(kinds) if k == "engine"), 0)
    # py-spy qualifies names (`_exception_logger.<locals>.wrapper`); faulthandler gives the bare one
    callees = (f.func.rsplit(".", 1)[-1] for f in reversed(frames[:at]))
    return Place(frames[at], next((name for name in callees if name not in _WRAPPERS), None))


@dataclass(frozen=True)
class Group:
    """Ranks at one place."""

    ranks: tuple[int, ...]
    place: Place


@dataclass(frozen=True)
class Verdict:
    """The groups, the odd one (smallest) first; `missing`: ranks without a stack; `line`: the sentence."""

    groups: tuple[Group, ...]
    missing: tuple[int, ...]
    line: str


def _who(ranks: tuple[int, ...], world: int) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) == world and world > 2:
        return f"all {world} ranks"
    return "ranks " + ", ".join(map(str, ranks))


def verdict(stacks: list[RankStack]) -> Verdict:
    """Group the ranks by place and say it in one line (`verdict_of_places`)."""
    places: dict[int, Place | None] = {}
    for s in stacks:
        main = s.main_thread()
        places[s.rank] = place_of(main) if main else None
    return verdict_of_places(places)


def verdict_of_places(places: dict[int, Place | None]) -> Verdict:
    """Group the ranks by place (None: no stack) and say it in one line: the smallest group first (on a
    tie, one running its own frame before one waiting in a call: the waiting ranks wait for it)."""
    by_place: dict[tuple[str, int, str], list[int]] = {}
    keyed: dict[tuple[str, int, str], Place] = {}
    missing = []
    for rank in sorted(places):
        place = places[rank]
        if place is None:
            missing.append(rank)
            continue
        by_place.setdefault(place.key(), []).append(rank)
        keyed[place.key()] = place
    groups = tuple(sorted((Group(tuple(r), keyed[k]) for k, r in by_place.items()),
                          key=lambda g: (len(g.ranks), g.place.waits_in is not None, g.ranks)))
    world = len(places)
    parts = [f"{_who(g.ranks, world)} {g.place.describe(len(g.ranks) > 1)}" for g in groups]
    if missing:
        parts.append(f"no stack from {_who(tuple(missing), world)}")
    return Verdict(groups, tuple(missing), "; ".join(parts) if parts else "no rank's stack was captured")
