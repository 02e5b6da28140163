"""A banner under the header saying what the run is waiting for, or why it ended."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from mt.contract.events import FAILURE_CODES
from tui.format.fmt import safe_text
from tui.state.runstate import RunState


def notice_text(st: RunState, log_tail: list[str], failing_rank: int | None) -> Text | None:
    """What to tell the user about the state right now (None: nothing to say)."""
    if st.supervisor_lost:
        return Text(f"status.json says {_plain(st.state)}, but its supervisor (pid {st.status.supervisor_pid})"
                    f" is gone: the run is lost. {_resume_hint(st).capitalize()}.", style="bold red")
    hint = st.script_hint()
    if hint and st.state == "running":
        return Text(hint[0].upper() + hint[1:], style="yellow")
    if st.state == "starting" or (st.state == "running" and st.step is None):
        what = ("the supervisor to start torchrun" if st.status.torchrun_pid is None
                else "the script's first run.step" if st.script is not None   # it called mt.init (no hint above)
                else "rank 0 to report run_start" if not st.world_size else "the first optimizer step")
        return Text(f"Starting: waiting for {what}…", style="yellow")
    if st.state == "stopping":
        return Text("Stopping: waiting for the final checkpoint and the ranks to exit…", style="yellow")
    if st.state in ("failed", "killed"):
        reason = _plain(st.reason or st.run_end_reason or "no reason recorded")
        t = Text(f"Run {st.state}: {reason}", style="bold red")
        first = next((i for i in reversed(st.incidents)
                      if i.code in FAILURE_CODES and i.status == "open"), None)
        if first is not None:  # the exit incident's error line (tui/diagnose/exit.py classify_log), as --once and --headless say it
            said = st.first_failure() if st.exit_incident() is not None else None
            t.append(f"\nfirst failure: {_plain(said or first.title)}", style="red")
        if log_tail:
            who = f"rank{failing_rank}.log" if failing_rank is not None else "log"
            t.append(f"\nlast lines of {who}:", style="red")
            for line in log_tail[-4:]:
                t.append("\n  " + _plain(line), style="grey70")
        t.append(f"\n{_resume_hint(st)}", style="dim")
        return t
    if st.state == "stopped":
        return Text(f"Run stopped: {_plain(st.reason or st.run_end_reason or 'on request')}"
                    f"  ({_resume_hint(st)})", style="magenta")
    return None


def _resume_hint(st: RunState) -> str:
    """r resumes from a checkpoint; with none it would only be refused, so it is not offered."""
    if st.last_checkpoint is None:
        return "no checkpoint to resume from"
    return "press r to resume from the newest checkpoint"


def _plain(s: str) -> str:
    """The run's text with its control characters made visible, without emoji variation
    selectors, whose width terminals disagree on (a torn border)."""
    return "".join(ch for ch in safe_text(s) if ch != "\ufe0f" and ord(ch) < 0x1F000)


class Notice(Static):
    """Hidden when there is nothing to say."""

    _last: Text | None = None

    def say(self, text: Text | None) -> None:
        if text == self._last and self.display == (text is not None):
            return
        self._last = text
        self.display = text is not None
        if text is not None:
            self.update(text)
