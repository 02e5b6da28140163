"""The dashboard's `=` key: a one-line input of knobs, sent as a `set` request and answered in the notice line."""
from __future__ import annotations

from typing import Any

from textual.binding import Binding

from mt.contract.knobs import KnobError, parse_settings
from tui.widgets.knobinput import KnobInput

KNOB_BINDING = Binding("equals_sign", "set_knob", "Set", id="set-knob", key_display="=",
                       tooltip="Turn knobs of the live run: KEY=VALUE (lr_scale, grad_clip, eval_every, ..., skip_batches)")


class KnobKeys:
    """Mixed into the dashboard screen, which provides `run_dir`, `requests`, `say` and `_refused`."""

    def action_set_knob(self: Any) -> None:
        if not self._refused("set"):
            self.app.push_screen(KnobInput(), self.send_knobs)

    def send_knobs(self: Any, line: str | None) -> None:
        """Check the line (a bad one is said, nothing sent), then send it as a `set` request."""
        if line is None or not line.strip():
            return
        try:
            settings = parse_settings(line.split())
        except KnobError as e:
            self.say(f"set refused: {e}", "error", title="knobs")
            return
        from tui.supervise.control import send_request  # import lazily, as the other control keys do
        try:
            rid = send_request(self.run_dir, "set", settings)
        except Exception as e:  # noqa: BLE001 - a failed request is said in the UI, never a crash
            self.say(f"could not send set: {e}", "error", title="knobs")
            return
        self.requests.add(rid, "set")
        what = " ".join(f"{k}={v:g}" for k, v in settings.items())
        self.say(f"set {what} requested: every rank applies it from the step after rank 0 takes it", title="knobs")
