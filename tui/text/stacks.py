"""`mt stacks RUN`: take a capture now and print the groups, the odd one first (--all: every rank's stack)."""
from __future__ import annotations

from pathlib import Path
from typing import TextIO

from tui.diagnose.stacks import RankStack
from tui.run.stacks import Capture, capture
from tui.text.format import safe_text


def _stack_lines(stack: RankStack) -> list[str]:
    main = stack.main_thread()
    lines = []
    for thread in sorted(stack.threads, key=lambda t: not t.main):
        if thread is not main and not thread.frames:
            continue
        title = "main thread" if thread is main else f"thread {thread.name or thread.ident}"
        lines.append(f"    {title}:")
        lines += [f"      {f.func} ({f.where()})" for f in thread.frames]
    return lines


def render(cap: Capture, show_all: bool) -> list[str]:
    """The verdict line, then one line per group (and per rank without a stack), then --all's stacks."""
    by_rank = {s.rank: s for s in cap.stacks}
    out = [cap.verdict.line]
    for g in cap.verdict.groups:
        paths = sorted({by_rank[r].source for r in g.ranks})
        who = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else "ranks " + ", ".join(map(str, g.ranks))
        out.append(f"  {who}: {g.place.frame.func} ({g.place.frame.where()})"
                   + (f" -> {g.place.waits_in}" if g.place.waits_in else "") + f"  [{', '.join(paths)}]")
    for r in cap.verdict.missing:
        out.append(f"  rank {r}: no stack: {by_rank[r].note}")
    if show_all:
        for s in cap.stacks:
            out.append(f"rank {s.rank} (pid {s.pid}, {s.source}{': ' + s.note if s.note else ''}):")
            out += _stack_lines(s)
    out.append(f"kept in {cap.folder} ({cap.seconds:.2f} s)")
    return [safe_text(line) for line in out]


def print_stacks(run_dir: Path, show_all: bool, out: TextIO) -> None:
    """Capture now and print; NotARunError / NoRanksError go to the caller (exit 2)."""
    for line in render(capture(run_dir), show_all):
        print(line, file=out)
