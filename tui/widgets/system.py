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
    if len(gpus) > 2:
        for g in gpus:  # a node of many GPUs: one line each
            idx = g.get("index")
            t.append(f"GPU{idx} ", style="bold")
            t.append(f"{fmt_field(g.get('util_pct'), '>3.0f', '%')} ")
            t.append(sparkline(view.gpu_util.get(idx, ()), 8), style="cyan")
            t.append(" ")
            t.append_text(bar(g.get("mem_used_bytes"), g.get("mem_total_bytes"), 6))
            t.append(f" {fmt_gib(g.get('mem_used_bytes'))}/{fmt_gib(g.get('mem_total_bytes'))}G"
                     f" {fmt_field(g.get('temp_c'), '.0f', '°C')} {fmt_field(g.get('power_w'), '.0f', 'W')}\n")
    elif gpus:
        for g in gpus:
            idx = g.get("index")
            t.append(f"GPU{idx} ", style="bold")
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
    ranks = s.get("ranks") or []
    for r in ranks:
        alive = r.get("alive")
        t.append(f"rank{r.get('rank')} ", style="bold" if alive is not False else "bold red")
        t.append(f"cpu {fmt_field(r.get('cpu_pct'), '>5.0f', '%')}  rss {fmt_gib(r.get('rss_bytes'))} GiB",
                 style="dim" if ended else "")
        if alive is False:
            t.append("  exited", style="red")
        elif ended:
            t.append("  last seen", style="dim")
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
