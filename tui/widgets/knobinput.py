"""The one-line input of the dashboard's `=` key: knobs to turn, as `KEY=VALUE ...`."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from mt.contract.knobs import SPECS


class KnobInput(ModalScreen["str | None"]):
    """Dismisses with the line typed (Enter), or None (Escape)."""

    DEFAULT_CSS = """
    KnobInput { align: center bottom; }
    #knob-box { width: 100%; max-width: 100; height: auto; border: thick $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="knob-box"):
            yield Static(Text(f"Set knobs, KEY=VALUE ... (Enter sends, Esc cancels): {', '.join(SPECS)}"))
            yield Input(placeholder="lr_scale=0.5 skip_batches=20", id="knob-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
