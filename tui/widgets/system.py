"""System panel: per-GPU utilisation / memory / temperature / power, or per-rank CPU and host."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual.widgets import Static

from tui.format.fmt import NA, anatomy_text, fmt_duration, fmt_field, fmt_gib, safe_text
from tui.read.nodes import NodeView
from tui.read.watcher import SystemView
from tui.report.nodes import node_lines
from tui.state.runstate import RunState

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Iterable[Any], width: int = 20) -> str:
    """Utilisation history as block characters; unreadable samples are blanks."""
    vals = list(values)[-width:]
    out = []
    for v in vals:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(SPARK[min(len(SPARK) - 1, max(0, int(v / 100 * len(SPARK))))])
        else:
            out.append(" ")
    return "".join(out)


def bar(used: Any, total: Any, width: int = 12) -> Text:
    if not isinstance(used, (int, float)) or not isinstance(total, (int, float)) or total <= 0:
        return Text(NA.ljust(width), style="dim")
    frac = min(1.0, max(0.0, used / total))
    full = int(round(frac * width))
    style = "red" if frac > 0.95 else "yellow" if frac > 0.8 else "green"
    return Text("█" * full, style=style) + Text("░" * (width - full), style="grey37")


def not_live_note(view: SystemView, ended: str | None, now: float) -> str:
    """For the panel's bottom border: the readings of an ended run are its last ones, not live."""
    if not ended or view.sample is None:
        return ""
    t = view.sample.get("t")
    age = f" {fmt_duration(now - t)} ago" if isinstance(t, (int, float)) and not isinstance(t, bool) else ""
    return f"not live (run {ended}): last sample{age}"


NCCL_NOTE = "util: NCCL spins while it waits, so a GPU waiting for a peer reads busy"   # 76 columns at most


def gpu_label(g: dict[str, Any]) -> str:
    """`GPU3` (NVML's index, nvidia-smi's), `GPU3/1` for a MIG slice of it."""
    return f"GPU{g.get('index')}" + (f"/{g['mig']}" if g.get("mig") is not None else "")


def _ranks_on(g: dict[str, Any]) -> str:
    """`r0`, `r0,4`: the ranks that reported this GPU; "" before any has."""
    ranks = g.get("ranks") or []
    return "r" + ",".join(map(str, ranks)) if ranks else ""


def _peak_of(g: dict[str, Any], ranks: list[dict[str, Any]]) -> Any:
    """The most any rank on this GPU allocated during its last step (its heartbeat's), or None."""
    peaks = [r.get("mem_peak_bytes") for r in ranks if r.get("rank") in (g.get("ranks") or [])]
    peaks = [p for p in peaks if isinstance(p, int)]
    return max(peaks) if peaks else None


def _gpu_of(r: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    """The rank's GPU as the panel names it (`GPU3`), or "" when it reported none."""
    g = next((g for g in gpus if r.get("rank") in (g.get("ranks") or [])), None)
    return gpu_label(g) if g is not None else ("GPU ?" if r.get("gpu") else "")


def _allocator(r: dict[str, Any]) -> str:
    """`alloc 30.0 res 70.0 pk 40.0/80 GiB`: the rank's allocator at its last step, "" without it."""
    if r.get("mem_peak_bytes") is None:
        return ""
    total = r.get("mem_total_bytes")
    return (f"alloc {fmt_gib(r.get('mem_alloc_bytes'))} res {fmt_gib(r.get('mem_reserved_bytes'))} "
            f"pk {fmt_gib(r.get('mem_peak_bytes'))}/{fmt_gib(total)} GiB")


def render_system(view: SystemView, ended: str | None = None, sampled: bool = True) -> Text:
    """The panel text for the newest sample (or a note that none arrived yet). `ended` (the
    run's final state, or `lost`): rank readings are marked as the last ones seen. `sampled`
    False: no supervisor samples this run (a script started without mt launch)."""
    s = view.sample
    if s is None and not sampled:
        return Text("no system samples: this run was started without mt launch, whose supervisor samples the "
                    "GPUs, ranks and host (system.jsonl); start it with `mt launch` to get them", style="dim")
    if s is None:
        return Text("no system samples yet (system.jsonl is written by the supervisor)", style="dim")
    t = Text()
    gpus = s.get("gpus") or []
    ranks = s.get("ranks") or []
    width = max((len(gpu_label(g)) for g in gpus), default=0)
    rwidth = max((len(_ranks_on(g)) for g in gpus), default=0)
    if len(gpus) > 2:
        for g in gpus:  # a node of many GPUs: one line each, eight of them on an 80x24 screen
            idx = g.get("index")
            t.append(f"{gpu_label(g):<{width}} ", style="bold")
            if rwidth:
                t.append(f"{_ranks_on(g):<{rwidth}} ", style="cyan")
            t.append(f"{fmt_field(g.get('util_pct'), '>3.0f', '%')} ")
            t.append(sparkline(view.gpu_util.get(idx, ()), 6), style="cyan")
            t.append(" ")
            t.append_text(bar(g.get("mem_used_bytes"), g.get("mem_total_bytes"), 6))
            t.append(f" {fmt_gib(g.get('mem_used_bytes'))}/{fmt_gib(g.get('mem_total_bytes'))}G")
            peak = _peak_of(g, ranks)
            if peak is not None:
                t.append(f" pk {fmt_gib(peak)}G", style="magenta")
            t.append(f" {fmt_field(g.get('temp_c'), '.0f', '°C')} {fmt_field(g.get('power_w'), '.0f', 'W')}\n")
    elif gpus:
        for g in gpus:
            idx = g.get("index")
            t.append(f"{gpu_label(g)} ", style="bold")
            if _ranks_on(g):
                t.append(f"{_ranks_on(g)} ", style="cyan")
            t.append(f"{safe_text(g.get('name') or NA)[:22]}\n", style="dim")
            t.append(f" util {fmt_field(g.get('util_pct'), '>3.0f', '%')} ")
            t.append(sparkline(view.gpu_util.get(idx, ())), style="cyan")
            t.append("\n mem ")
            t.append_text(bar(g.get("mem_used_bytes"), g.get("mem_total_bytes")))
            t.append(f" {fmt_gib(g.get('mem_used_bytes'))}/{fmt_gib(g.get('mem_total_bytes'))} GiB\n")
            t.append(f" {fmt_field(g.get('temp_c'), '.0f', '°C')}  {fmt_field(g.get('power_w'), '.0f', ' W')}\n")
    else:
        why = s.get("nvml_error") or ("no GPUs" if s.get("nvml") else "NVML not available")
        t.append(f"GPUs: none ({safe_text(why)})\n", style="dim")
    if len(gpus) > 1 or sum(1 for r in ranks if r.get("gpu")) > 1:
        t.append(NCCL_NOTE + "\n", style="dim")
    for r in ranks:
        alive = r.get("alive")
        t.append(f"rank{r.get('rank')} ", style="bold" if alive is not False else "bold red")
        on = _gpu_of(r, gpus)
        if on:
            t.append(f"{on} ", style="cyan")
        t.append(f"cpu {fmt_field(r.get('cpu_pct'), '>5.0f', '%')}  rss {fmt_gib(r.get('rss_bytes'))} GiB",
                 style="dim" if ended else "")
        if alive is False:
            t.append("  exited", style="red")
        elif ended:
            t.append("  last seen", style="dim")
        mem = _allocator(r)
        if mem and alive is not False:   # PyTorch's own view: what the tensors hold, not NVML's used
            t.append(f"  {mem}", style="dim" if ended else "magenta")
        t.append("\n")
        parts = view.anatomy.get(r.get("rank"))  # type: ignore[arg-type]
        if parts and alive is not False:  # its step: where the time goes, who waits for whom
            t.append(f"  {anatomy_text(parts, short=True)}\n", style="dim")
    h = s.get("host") or {}
    t.append(f"host cpu {fmt_field(h.get('cpu_pct'), '.0f', '%')}  load {fmt_field(h.get('load1'), '.2f')}\n")
    t.append("host mem ")
    t.append_text(bar(h.get("mem_used_bytes"), h.get("mem_total_bytes")))
    t.append(f" {fmt_gib(h.get('mem_used_bytes'))}/{fmt_gib(h.get('mem_total_bytes'))} GiB")
    return t


def render_nodes(nodes: list[NodeView], now: float, max_lines: int, run: RunState | None = None) -> Text:
    """A job's panel: every node and its ranks, grouped (tui/format/fmt.py `node_lines`)."""
    t = Text()
    for i, (line, style) in enumerate(node_lines(nodes, now, max_lines, run=run)):
        t.append(("\n" if i else "") + line, style=style)
    return t


class SystemPanel(Static, can_focus=True):
    """Re-rendered when a new sample arrives."""

    _last: Text | None = None

    def show(self, view: SystemView, ended: str | None = None, now: float = 0.0, sampled: bool = True,
             nodes: list[NodeView] | None = None, run: RunState | None = None) -> None:
        """`nodes`: a job's nodes, shown instead of this machine's sample (no rank's step behind `run`'s)."""
        self.border_subtitle = "" if nodes else not_live_note(view, ended, now)
        # the panel is at most 14 rows beside the plots, the screen's height as a tab
        rows = max(14, self.size.height - 2) if nodes else 0
        text = render_nodes(nodes, now, rows, run) if nodes else render_system(view, ended, sampled)
        if text != self._last:
            # a relayout only when the number of lines changes (the panel is height: auto)
            relayout = self._last is None or len(text.split()) != len(self._last.split())
            self._last = text
            self.update(text, layout=relayout)
