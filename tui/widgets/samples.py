"""The samples view (`v`): the newest eval's generated samples ([eval] prompts) and its factory numbers."""
from __future__ import annotations

from typing import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.format.fmt import fmt_values, safe_text
from tui.state.samples import EvalOutputs

NONE_YET = ("No samples yet. `[eval] prompts = [...]` in the preset writes each prompt's continuation "
            "at every eval ([train] eval_every), and `[eval] factory` its own numbers.")


def samples_text(ev: EvalOutputs) -> Text:
    """The view's text: a title, the factory's numbers, then each prompt (bold) and what the model wrote after it."""
    samples = ev.newest()
    t = Text(f"Samples at step {ev.step}\n" if samples else "Samples\n", style="bold")
    if ev.metrics:
        t.append(f"eval @{ev.metrics_step}: {fmt_values(ev.metrics)}\n", style="cyan")
    if not samples:
        t.append("\n" + NONE_YET + "\n", style="dim")
    for s in samples:
        t.append(f"\n[{s.index}] ", style="bold cyan")
        t.append(safe_text(s.prompt, lines=True), style="bold")   # the run's text: escaped, never obeyed
        t.append(safe_text(s.text, lines=True))
        t.append(f"  ({s.tokens} tokens)\n", style="dim")
    t.append("\nv / Esc closes", style="dim")
    return t


class SamplesScreen(ModalScreen[None]):
    """The newest samples over the dashboard, redrawn each second while open (↑ ↓ scroll a long one)."""

    BINDINGS = [Binding("escape,q,v", "app.pop_screen", "Close")]

    def __init__(self, read: Callable[[], Text | None]) -> None:
        super().__init__()
        self.read = read   # the text now, or None while the run's state is being updated

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="samples"):
            yield Static(self.read() or Text("reading the run…"), id="samples-text")

    def on_mount(self) -> None:
        self.set_interval(1.0, self._refresh)

    def _refresh(self) -> None:
        text = self.read()
        if text is not None:
            self.query_one("#samples-text", Static).update(text)
