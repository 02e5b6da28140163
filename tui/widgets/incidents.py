"""Incidents panel: open and recent incidents; the highlighted one's detail, advice, evidence."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from mt.contract.incident import IncidentLine
from tui.format.fmt import NA, anatomy_lines, fmt_duration, fmt_num, safe_text, stacks_lines
from tui.state.runstate import cause_of

MAX_VALUE_CHARS = 300  # an evidence value longer than this (a whole traceback line) is cut

SEVERITY_STYLE = {"info": "cyan", "warn": "yellow", "error": "bold red"}


def incident_line(inc: IncidentLine, now: float) -> Text:
    style = SEVERITY_STYLE.get(inc.severity, "")
    t = Text()
    t.append(f"{inc.severity.upper():5} ", style=style)
    t.append(f"@{inc.step if inc.step is not None else NA} ")
    t.append(f"{fmt_duration(now - inc.t) if inc.t else NA} ago ", style="dim")
    t.append(safe_text(inc.title), style="" if inc.status == "open" else "dim strike")
    return t


def evidence_value(v: Any) -> str:
    """One evidence value as text: numbers as the header prints them, lists joined, null N/A."""
    if v is None or isinstance(v, float):
        out = fmt_num(v)
    elif isinstance(v, (bool, int, str)):
        out = safe_text(v)
    elif isinstance(v, dict):
        out = ", ".join(f"{safe_text(k)}={evidence_value(x)}" for k, x in v.items())
    elif isinstance(v, (list, tuple)):
        out = ", ".join(evidence_value(x) for x in v)
    else:
        out = safe_text(v)
    return out if len(out) <= MAX_VALUE_CHARS else out[: MAX_VALUE_CHARS - 1] + "…"


STACKS_KEYS = ("verdict", "groups", "frames", "workers")  # shown as the stacks block, not as raw evidence


def stacks_block(evidence: dict[str, Any]) -> Text:
    """A capture's verdict, then the odd rank's innermost user frames one a line (empty without a capture)."""
    t = Text()
    lines = stacks_lines(evidence)
    if not lines:
        return t
    t.append("stacks: ", style="bold magenta")
    t.append(lines[0].removeprefix("stacks: ") + "\n")
    for line in lines[1:]:  # the DataLoader workers' places
        t.append(f"  {line}\n")
    frames = evidence.get("frames")
    for f in frames if isinstance(frames, list) else []:
        t.append(f"  {safe_text(f)}\n", style="" if str(f).startswith("rank ") else "dim")
    return t


ROLLBACK_CODES = ("nan_loss", "loss_spike")  # the incidents the dashboard's `b` rolls back past (tui/view/rollbackkey.py)


def incident_detail(inc: IncidentLine, cause: str | None = None) -> Text:
    """The captured stacks (or mt replay's cause), the detail, the advice, then the evidence as `key: value` lines (Static wraps them)."""
    t = Text()
    t.append(f"{safe_text(inc.code)} ({inc.status}, from {safe_text(inc.source)})\n", style="bold")
    if cause:
        t.append("cause (mt replay): ", style="bold magenta")
        t.append(safe_text(cause) + "\n")
    stacks = stacks_block(inc.evidence)
    t.append_text(stacks)  # the answer first: which rank, where
    for i, line in enumerate(anatomy_lines(inc.evidence)):  # a straggler: who waits for whom, each rank's step
        t.append(("" if i == 0 else "  ") + line + "\n", style="bold magenta" if i == 0 else "")
    if inc.detail:
        t.append(safe_text(inc.detail, lines=True) + "\n")
    if inc.advice:  # what to do comes before the numbers that show why
        t.append("advice: ", style="green")
        t.append(safe_text(inc.advice, lines=True) + "\n")
    if inc.code in ROLLBACK_CODES:  # the advice written in the run cannot name the key: said here
        t.append("b: ", style="green")
        t.append(f"roll back past it: continue from the checkpoint before step {inc.step}, skipping the data through it "
                 "(asks first; `mt rollback RUN`)\n")
    if inc.evidence:
        t.append("evidence:\n", style="dim")
        for k, v in inc.evidence.items():
            if k in STACKS_KEYS and stacks or k == "anatomy" and isinstance(inc.evidence.get("why"), str):
                continue
            t.append(f"  {safe_text(k)}: ", style="dim")
            t.append(evidence_value(v) + "\n")
    t.rstrip()
    return t


def ordered(incidents: list[IncidentLine]) -> list[IncidentLine]:
    """Open ones first (newest first), then the closed ones."""
    return sorted(incidents, key=lambda i: (i.status != "open", -(i.t or 0)))


class IncidentsPanel(Vertical, can_focus=False):
    """A list of incidents with a detail pane under it."""

    def compose(self) -> ComposeResult:
        yield OptionList(id="incident-list")
        # a long detail scrolls in place of running off the bottom of the panel
        with VerticalScroll(id="incident-detail-box"):
            yield Static("", id="incident-detail")

    def on_mount(self) -> None:
        self._shown: list[IncidentLine] = []
        self._sig: tuple = ()
        self._causes: dict[int, str] = {}

    def show(self, incidents: list[IncidentLine], now: float, causes: dict[int, str] | None = None) -> None:
        items = ordered(incidents)[:50]
        self._causes = causes or {}
        sig = tuple((i.code, i.step, i.status, "verdict" in i.evidence, cause_of(self._causes, i)) for i in items) + (int(now) // 10,)
        if sig == self._sig:
            return
        self._sig = sig
        ol = self.query_one(OptionList)
        keep = ol.highlighted
        self._shown = items
        ol.set_options([Option(incident_line(i, now)) for i in items] or
                       [Option(Text("no incidents", style="dim"), disabled=True)])
        if items:
            ol.highlighted = keep if keep is not None and keep < len(items) else 0
            self._detail(ol.highlighted)
        else:
            self.query_one("#incident-detail", Static).update("")

    def _detail(self, index: int | None) -> None:
        if index is not None and 0 <= index < len(self._shown):
            inc = self._shown[index]
            self.query_one("#incident-detail", Static).update(incident_detail(inc, cause_of(self._causes, inc)))

    @on(OptionList.OptionHighlighted)
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._detail(event.option_index)
