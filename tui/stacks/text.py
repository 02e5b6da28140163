"""`mt stacks`: take a capture now and print the groups, the odd one first (--all: every rank's stack)."""
from __future__ import annotations

from pathlib import Path
from typing import TextIO

from mt.contract import door
from tui.format.fmt import safe_text
from tui.stacks.capture import Capture, capture_ranks, ranks_of_pid
from tui.stacks.nodes import NodesVerdict, capture_everywhere
from tui.stacks.verdict import Group, RankStack


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


def _group_line(g: Group, tag: str) -> str:
    who = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else "ranks " + ", ".join(map(str, g.ranks))
    return (f"  {who}: {g.place.frame.func} ({g.place.frame.where()})"
            + (f" -> {g.place.waits_in}" if g.place.waits_in else "") + f"  [{tag}]")


def render(cap: Capture, show_all: bool) -> list[str]:
    """The verdict line, then one line per group (and per rank without a stack), then --all's stacks."""
    by_rank = {s.rank: s for s in cap.stacks}
    out = [cap.verdict.line]
    for g in cap.verdict.groups:
        out.append(_group_line(g, ", ".join(sorted({by_rank[r].source for r in g.ranks}))))
    for r in cap.verdict.missing:
        out.append(f"  rank {r}: no stack: {by_rank[r].note}")
    if show_all:
        for s in cap.stacks:
            out.append(f"rank {s.rank} (pid {s.pid}, {s.source}{': ' + s.note if s.note else ''}):")
            out += _stack_lines(s)
    out.append(f"kept in {cap.folder} ({cap.seconds:.2f} s)" if cap.folder is not None
               else f"kept nowhere (--out DIR keeps it) ({cap.seconds:.2f} s)")
    return [safe_text(line) for line in out]


STACK_MAX_BYTES = 1 << 20
"""At most this much of one rank's kept stack file is shown (a py-spy dump is a few KiB)."""


def _stack_text(path: Path) -> str:
    """A kept rank*.txt, through the door: its first STACK_MAX_BYTES, or why it cannot be shown."""
    try:
        return door.read_head(path, STACK_MAX_BYTES).decode("utf-8", "replace")
    except OSError as e:    # gone, or refused: a FIFO, a device, a link
        return f"(not shown: {e})"


def render_nodes(found: NodesVerdict, show_all: bool) -> list[str]:
    """The verdict over every node's capture, one line per group naming its nodes, then each node's folder."""
    out = [found.verdict.line]
    for g in found.verdict.groups:
        out.append(_group_line(g, "node " + ", ".join(sorted({found.node_of[r] for r in g.ranks}))))
    for r in found.verdict.missing:
        out.append(f"  rank {r}: no stack (node {found.node_of.get(r, '?')}; see its verdict.json)")
    for node, folder in sorted(found.folders.items()):
        out.append(f"node {node}: kept in {folder}")
        if show_all:
            for f in sorted(folder.glob("rank*.txt")):
                out.append(f"  {f.name}:")
                out += ["    " + line for line in _stack_text(f).splitlines()]
    if found.silent:
        out.append(f"no capture from node {', '.join(found.silent)} (its supervisor did not answer)")
    return [safe_text(line) for line in out]


def print_stacks(run_dir: Path, show_all: bool, out: TextIO, timeout: float = 15.0) -> None:
    """Capture now and print (a job's shared run directory: ask every node's supervisor and wait up
    to `timeout`); NotARunError / NoRanksError go to the caller (exit 2)."""
    found = capture_everywhere(run_dir, timeout)
    for line in render_nodes(found, show_all) if isinstance(found, NodesVerdict) else render(found, show_all):
        print(line, file=out)


def verdict_note(found: Capture | NodesVerdict) -> str:
    """One line for the dashboard's notice: the verdict and where the stacks are kept."""
    if isinstance(found, NodesVerdict):
        silent = f"; no answer from node {', '.join(found.silent)}" if found.silent else ""
        return safe_text(f"stacks: {found.verdict.line} ({len(found.folders)} nodes{silent})")
    return safe_text(f"stacks: {found.verdict.line} ({found.folder.name})")


def print_pid_stacks(pid: int, out_dir: Path | None, show_all: bool, out: TextIO) -> None:
    """`mt stacks --pid`: the ranks of the torchrun job `pid` belongs to, by py-spy (kept under out_dir if given)."""
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    for line in render(capture_ranks(ranks_of_pid(pid), out_dir), show_all):
        print(line, file=out)
