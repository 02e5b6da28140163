"""The `mt watch --once` summary of a RunState."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tui.format.fmt import (
    anatomy_lines,
    at_step,
    fmt_best_checkpoints,
    fmt_duration,
    fmt_epoch,
    fmt_eta,
    fmt_knobs,
    fmt_loss,
    fmt_num,
    fmt_parallel,
    fmt_params,
    fmt_rate,
    fmt_rollback,
    fmt_sample,
    fmt_step,
    fmt_values,
    fmt_write_time,
    or_na,
    safe_text,
    stacks_lines,
)
from tui.state.runstate import cause_of

if TYPE_CHECKING:
    from tui.state.runstate import RunState


def format_summary(st: "RunState", now: float | None = None) -> str:
    """A few plain-text lines for `mt watch --once`."""
    now = time.time() if now is None else now
    parallel = fmt_parallel(st.strategy, st.compile, st.activation_checkpointing)
    lines = [
        f"{st.name}  [{st.shown_state}]  attempt {st.attempt}  step {fmt_step(st.step, st.max_steps)}"
        f"{fmt_epoch(st.epoch, '  epoch ')}  elapsed {fmt_duration(st.elapsed_s(now))}  ETA {fmt_eta(st.eta_s(), st.quiet_s(now))}",
        f"loss {fmt_loss(st.loss, st.loss_floor)}  best {fmt_num(st.best_loss)}"
        f"{'' if st.best_loss_step is None else f' @{st.best_loss_step}'}"
        f"{' (recent steps only)' if st.best_loss_partial else ''}"
        f"  val {fmt_num(st.val_loss)}  lr {fmt_num(st.lr, '.3g')}  grad_norm {fmt_num(st.grad_norm)}"
        f"  {fmt_rate(st.tokens_per_s, st.samples_per_s)}",
        f"world {or_na(st.world_size)} x {or_na(st.device)}"
        f"{'  ' + parallel if parallel else ''}"
        f"  precision {or_na(st.precision)}"
        f"  eff. batch {or_na(st.effective_batch)}"
        f"{'' if st.params_total is None else '  ' + fmt_params(st.params_total, st.params_trainable, st.params_active)}",
        f"{'  knobs ' + fmt_knobs(st.knobs) if fmt_knobs(st.knobs) else ''}",
    ]
    lines += eval_lines(st)
    ck = st.last_checkpoint
    lines.append("checkpoint: none" if ck is None else
                 f"checkpoint: step {ck.step} ({fmt_duration(ck.age_s(now))} ago"
                 f"{'; ' + fmt_write_time(ck.seconds, ck.blocking_s) if ck.seconds is not None else ''})  {ck.path}")
    if st.best_checkpoints:   # [checkpoint] keep_best: never deleted by keep_last
        lines.append(f"best checkpoint{'s' * (len(st.best_checkpoints) > 1)}: {fmt_best_checkpoints(st.best_metric, st.best_checkpoints)}")
    if st.rollback is not None:
        rb = st.rollback
        lines.append(fmt_rollback(rb.step, rb.to_step, rb.skip_batches, rb.lr_scale, rb.why, rb.by, st.rollbacks))
    if st.incidents:   # every incident of the run, from the engine or the supervisor, open or closed
        lines.append(f"incidents: {len(st.open_incidents)} open, {len(st.incidents) - len(st.open_incidents)} closed")
        for inc in st.incidents:
            lines.append(f"  {inc.status:<6} [{inc.severity}] {inc.code} {at_step(inc.step)}: {inc.title}")
            lines += [f"         {line}" for line in stacks_lines(inc.evidence) + anatomy_lines(inc.evidence)]
            cause = cause_of(st.causes, inc)
            if cause:
                lines.append(f"         cause (mt replay): {cause}")
    reason = st.first_failure() if st.state == "failed" else st.reason or st.run_end_reason
    if st.is_final and reason:
        lines.append(f"reason: {reason}")
    hint = st.script_hint()
    if hint:
        lines.append(hint)
    if st.bad_lines:
        why = f" (newest: {st.bad_reason})" if st.bad_reason else ""
        lines.append(f"skipped {st.bad_lines} unreadable event line(s){why}")
    return safe_text("\n".join(lines), lines=True)   # names, titles, reasons and paths are the run's


def eval_lines(st: "RunState", width: int = 160) -> list[str]:
    """The newest eval's factory numbers and generated samples ([eval]), one line each."""
    ev = st.evals
    lines = [f"eval @{ev.metrics_step}: {fmt_values(ev.metrics)}"] if ev.metrics else []
    samples = ev.newest()
    if samples:
        lines.append(f"samples @{ev.step}:")
        lines += [f"  [{s.index}] {fmt_sample(s.prompt, s.text, width)}" for s in samples]
    return lines
