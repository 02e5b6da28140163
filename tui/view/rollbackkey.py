"""The dashboard's `b`: roll the run back past its newest NaN or loss spike, as `mt rollback` does
(tui/supervise/rollback.py), after asking. Kept beside the screen, mixed into it."""
from __future__ import annotations

from typing import Any

from textual.binding import Binding

from tui.format.fmt import safe_text
from tui.view.messages import ControlAsked
from tui.widgets.dialogs import ConfirmScreen
from tui.widgets.incidents import ROLLBACK_CODES

ROLLBACK_BINDING = Binding("b", "rollback", "Roll back", id="rollback",
                           tooltip="After a NaN or loss spike: continue from the checkpoint before it, skipping that data (asks first)")


class RollbackKey:
    """Mixed into the dashboard screen (which has `watcher`, `say` and the app's ControlAsked worker)."""

    def action_rollback(self: Any) -> None:
        st = self.watcher.follower.state
        bad = next((i for i in reversed(st.incidents) if i.code in ROLLBACK_CODES and i.step is not None), None)
        if bad is None:
            self.say("b rolls back past a NaN or loss spike incident, and this run has none; "
                     "`mt rollback RUN --to STEP` goes back to any checkpoint", "warning")
            return
        if st.state == "starting":
            self.say("the run is starting: roll it back once it runs or ends", "warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.say(f"rolling back past the {bad.code} at step {bad.step}…", title="rollback")
                self.post_message(ControlAsked("rollback"))

        live = "" if st.is_final else "Stop the run (a final checkpoint), then continue "
        self.app.push_screen(ConfirmScreen(
            f"Roll back run {safe_text(st.name)}?\n{live or 'Continue '}from the newest checkpoint before the {bad.code} "
            f"at step {bad.step},\nskipping every batch from it through that step (as `mt rollback`).\n"
            "The steps after that checkpoint are abandoned (their checkpoints kept in checkpoints/abandoned/)."), answered)
