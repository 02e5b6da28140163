"""The run header: name, state, progress, throughput, world, checkpoint."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.format.fmt import (
    fmt_duration,
    fmt_epoch,
    fmt_eta,
    fmt_knobs,
    fmt_loss,
    fmt_num,
    fmt_parallel,
    fmt_params,
    fmt_rate,
    fmt_step,
    or_na,
    safe_text,
)
from tui.state.runstate import RunState

STATE_STYLE = {
    "pending": "bold blue", "starting": "bold yellow", "running": "bold green", "stopping": "bold yellow",
    "completed": "bold cyan", "stopped": "bold magenta", "failed": "bold red", "killed": "bold red",
}


def progress_bar(step: int | None, total: int | None, width: int) -> Text:
    """A text progress bar (deterministic, unlike an animated widget)."""
    if width <= 0:
        return Text("")
    frac = 0.0 if not step or not total else min(1.0, step / total)
    full = int(frac * width)
    return Text("█" * full, style="green") + Text("░" * (width - full), style="grey37")


def render_header(st: RunState, now: float, width: int, smoothing: float, logy: bool,
                  window: str = "all steps") -> Text:
    """Two or three lines of header text for a state at time `now`."""
    pct = f" {100 * st.step / st.max_steps:.0f}%" if st.step and st.max_steps else ""
    pct += fmt_epoch(st.epoch, "  epoch ")
    state = st.shown_state
    line1 = Text.assemble(
        (safe_text(st.name), "bold"), "  ", (f" {state.upper()} ", STATE_STYLE.get(state, "bold red") + " reverse"),
        f"  attempt {st.attempt}  step {fmt_step(st.step, st.max_steps, grouped=True)}{pct} ")
    bar_w = max(0, min(30, width - line1.cell_len - 2))
    line1.append_text(progress_bar(st.step, st.max_steps, bar_w))
    parts = [f"ETA {fmt_eta(st.eta_s(), st.quiet_s(now))}", fmt_rate(st.tokens_per_s, st.samples_per_s)]
    if st.mfu is not None:
        parts.append(f"MFU {'~' if st.mfu_estimated else ''}{fmt_num(100 * st.mfu, '.1f')}%"
                     + (" (6N estimate)" if st.mfu_estimated else ""))
    parts.append(f"elapsed {fmt_duration(st.elapsed_s(now))}")
    parallel = fmt_parallel(st.strategy, st.compile, st.activation_checkpointing)
    parts.append(f"{or_na(st.world_size)} × {or_na(st.device)}" + (f" {parallel}" if parallel else ""))
    parts.append(f"{or_na(st.precision)}")
    parts.append(f"eff.batch {or_na(st.effective_batch)}")
    if st.params_total is not None:
        parts.append(fmt_params(st.params_total, st.params_trainable, st.params_active))
    if fmt_knobs(st.knobs):
        parts.append(f"knobs {fmt_knobs(st.knobs)}")
    ck = st.last_checkpoint
    parts.append("ckpt none" if ck is None else f"ckpt @{ck.step} ({fmt_duration(ck.age_s(now))} ago)")
    if st.best_checkpoints:   # the best one kept ([checkpoint] keep_best)
        parts.append(f"best ckpt @{next(iter(st.best_checkpoints))}")
    line2 = Text("  ".join(parts))
    line3 = Text.assemble(
        f"loss {fmt_loss(st.loss, st.loss_floor)}  best {fmt_num(st.best_loss)}  val {fmt_num(st.val_loss)}"
        f"  lr {fmt_num(st.lr, '.3g')}  grad_norm {fmt_num(st.grad_norm)}",
        ("  smoothing ", "dim"), (f"{smoothing:.2f}", "dim"), ("  log-y " + ("on" if logy else "off"), "dim"),
        (f"  window {window}", "dim"))
    if st.bad_lines:
        line3.append(f"  ({st.bad_lines} bad lines skipped)", style="yellow")
    return Text("\n").join([line1, line2, line3])


class RunHeader(Static):
    """Shows `render_header` for the latest state."""

    _last: Text | None = None

    def show(self, st: RunState, now: float, smoothing: float, logy: bool, window: str = "all steps") -> None:
        text = render_header(st, now, self.size.width or 120, smoothing, logy, window)
        if text != self._last:  # an unchanged header costs no repaint
            self._last = text
            self.update(text, layout=False)
