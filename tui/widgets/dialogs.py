"""Modal screens: confirm a kill, and the key help."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Yes / no; dismisses with True only on an explicit yes."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(Text(self.question), id="question")   # plain: a run's name is no markup
            with Horizontal(id="confirm-buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def help_rows(bindings: list[Binding]) -> list[tuple[str, str]]:
    """(key, what it does) for every binding, from the bindings themselves: nothing copied by hand."""
    return [(b.key_display or b.key, b.tooltip or b.description) for b in bindings]


class HelpScreen(ModalScreen[None]):
    """Lists every key binding of the app."""

    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close")]

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        t = Text("Keys\n\n", style="bold")
        for key, what in self.rows:
            t.append(f"  {key:>8}  ", style="bold cyan")
            t.append(what + "\n")
        t.append("\n  Esc / ? closes this help", style="dim")
        with VerticalScroll(id="help"):  # ↑ ↓ scroll it in a terminal lower than the list
            yield Static(t, id="help-text")
