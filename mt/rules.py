"""The incident rules inside training, on rank 0 (the supervisor's are in tui/diagnose/). Stdlib only.

`StepRules.observe` watches loss, grad norm and the fp16 loss scale after every optimizer step and
returns the incidents that open on it (`loss_spike`, `grad_explosion`, `clipping_active`,
`fp16_overflow`); `nan_incident`, `recompile_incident`, `disk_full_incident` and
`checkpoint_failed_incident` build the others. Each is an `Incident` (mt/contract/incident.py) the
engine emits as `emit("incident", **inc.event_fields())`. `is_clear` is shared with the supervisor,
which closes these incidents when the step stream shows the condition has gone.
"""
from __future__ import annotations

import bisect
import math
from collections import deque
from pathlib import Path
from typing import Any

from mt.contract.config import MonitorConfig
from mt.contract.events import as_float
from mt.contract.fmt import short_num
from mt.contract.incident import Incident
from mt.contract.space import DiskFullError

# MAD * 1.4826 estimates the standard deviation of normally distributed noise; successive
# differences carry sqrt(2) times the noise, and almost none of the (slow) trend, so the noise
# scale comes from them: a MAD over the raw window would count the initial fall as noise.
_DIFF_MAD_TO_SIGMA = 1.4826 / math.sqrt(2)
# The centre a spike is measured from: the median of the last 21 losses follows the trend yet
# ignores up to 10 outliers.
_CENTER_STEPS = 21


class RollingMedian:
    """The last `size` values kept both in arrival order and sorted: O(log n) median."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, x: float) -> None:
        if len(self._order) == self.size:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._order.append(x)
        bisect.insort(self._sorted, x)

    def median(self) -> float:
        return _middle(self._sorted)

    def recent(self, k: int) -> list[float]:
        return list(self._order)[-k:]


class LazyMedian:
    """The last `size` values; the median sorted on demand, for a window read only on a rare path."""

    def __init__(self, size: int) -> None:
        self._order: deque[float] = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._order)

    def add(self, x: float) -> None:
        self._order.append(x)

    def median(self) -> float:
        return _middle(sorted(self._order))


def _middle(s: list[float]) -> float:
    """The median of a sorted, non-empty list."""
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _finite(x: Any) -> float | None:
    if type(x) is float:  # the common case, once per field per step: keep it short
        return x if math.isfinite(x) else None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _r(x: float | None, digits: int = 4) -> float | None:
    """Round for evidence: readable numbers, still machine-usable."""
    return None if x is None else float(f"{x:.{digits}g}")


ADVICE = {
    "loss_spike": (
        "Look at raw loss, grad norm and lr around this step: a spike with a grad-norm jump is an "
        "optimisation instability, one without is often a bad batch. First lower the peak lr or "
        "lengthen warmup, keep grad clipping on (1.0), check the data shard that fed this step; "
        "if it recurs, resume from the last checkpoint before the spike and skip that data."
    ),
    "grad_explosion": (
        "Watch grad norm against lr and loss: exploding norms usually come before a loss spike or "
        "NaN. First lower lr (or lengthen warmup) and keep clipping at ~1.0; check for bad inputs, "
        "a missing normalisation, or fp16 overflow."
    ),
    "clipping_active": (
        "Clipping on nearly every step means the effective lr is much lower than configured: "
        "compare the median grad norm with train.grad_clip. Raise grad_clip toward the typical "
        "norm, or lower lr if the norms are large because training is unstable."
    ),
    "fp16_overflow": (
        "Check skipped steps and the loss scale: a few skips early are the GradScaler calibrating, "
        "repeated skips waste steps. Prefer bf16 where the hardware has it; otherwise lower lr, "
        "clip gradients after scaler.unscale_(), and look for activations that overflow fp16."
    ),
    "recompile": (
        "Each recompile costs a compile (seconds to minutes) and, past torch._dynamo.config.recompile_limit "
        "(8), that code runs eager. Read the reason: a size mismatch means the shapes change between steps: "
        "keep them fixed (pad to one length, drop the short last batch) or mark the dimension dynamic "
        "(torch._dynamo.mark_dynamic); dynamo itself compiles a dynamic-shape graph after the first change. "
        "Another guard (grad mode, a Python number or flag, a module attribute) must stay the same from step to step."
    ),
    "nan_loss": (
        "Check the data shard holding these sample indices (corrupt or extreme inputs), then lower "
        "lr or add warmup, check fp16 loss scaling (prefer bf16), keep grad clipping on; resume "
        "from the last checkpoint if the weights are already non-finite."
    ),
}


def is_clear(code: str, evidence: dict[str, Any], step: dict[str, Any]) -> bool:
    """Whether one step event no longer shows the condition an engine incident reported."""
    loss = _finite(as_float(step.get("loss")))
    if code == "nan_loss":
        return loss is not None
    if code == "loss_spike":
        limit = _finite(evidence.get("threshold"))
        return loss is not None and (limit is None or loss <= limit)
    if code == "grad_explosion":
        gn = _finite(as_float(step.get("grad_norm")))
        limit = _finite(evidence.get("threshold"))
        if evidence.get("reason") == "clipping":  # runs recorded before clipping_active had its own code
            return not step.get("clipped")
        return gn is not None and (limit is None or gn <= limit)
    if code == "clipping_active":
        return not step.get("clipped")
    if code == "recompile":
        return not step.get("recompiles")
    if code == "fp16_overflow":
        scale = _finite(as_float(step.get("loss_scale")))
        floor = _finite(evidence.get("min_scale")) or 0.0
        return not step.get("skipped") and (scale is None or scale >= floor)
    return True


class StepRules:
    """Rank 0's per-step watch on loss, grad norm and loss scale; each code fires once while open."""

    def __init__(self, monitor: MonitorConfig, grad_clip: float) -> None:
        self.m = monitor
        self.grad_clip = grad_clip
        self.losses = RollingMedian(_CENTER_STEPS)
        self.loss_diffs = LazyMedian(monitor.spike_window)  # |loss[i] - loss[i-1]|, read only above the floor
        self._last_loss: float | None = None
        self.grads = RollingMedian(monitor.spike_window)
        self.clipped: deque[bool] = deque(maxlen=monitor.clip_window)
        self.skipped: deque[bool] = deque(maxlen=monitor.overflow_window)
        self.steps_seen = 0
        self.calibrating = True  # GradScaler skips at the very start are calibration, not faults
        self.open: dict[str, dict[str, Any]] = {}  # code -> evidence of the open incident
        self._clean: dict[str, int] = {}  # code -> consecutive clean steps since it opened

    def observe(self, step: dict[str, Any]) -> list[Incident]:
        """Feed one optimizer step; returns the incidents that open on it."""
        if self.open:
            self._maybe_close(step)
        self.steps_seen += 1
        s = int(step.get("step") or self.steps_seen)
        out = []
        skipped = bool(step.get("skipped"))
        if not skipped:
            self.calibrating = False
        for check in (self._overflow, self._spike, self._grad, self._clipping):  # each returns at once when it does not apply
            inc = check(s, step, skipped)
            if inc is not None and inc.code not in self.open:
                self.open[inc.code] = inc.evidence
                self._clean[inc.code] = 0
                out.append(inc)
        if not skipped:
            loss = _finite(step.get("loss"))
            if loss is not None:
                self.losses.add(loss)
                if self._last_loss is not None:
                    self.loss_diffs.add(abs(loss - self._last_loss))
                self._last_loss = loss
            gn = _finite(step.get("grad_norm"))
            if gn is not None:
                self.grads.add(gn)
                self.clipped.append(bool(step.get("clipped")))
        return out

    def _maybe_close(self, step: dict[str, Any]) -> None:
        for code in list(self.open):
            if is_clear(code, self.open[code], step):
                self._clean[code] += 1
                if self._clean[code] >= self.m.close_after_steps:
                    del self.open[code]
            else:
                self._clean[code] = 0

    def _spike(self, s: int, step: dict[str, Any], skipped: bool) -> Incident | None:
        loss = _finite(step.get("loss"))
        if loss is None or skipped or len(self.loss_diffs) + 1 < self.m.spike_min_history:
            return None
        med = self.losses.median()
        floor = med + max(self.m.spike_min_jump * abs(med), self.m.spike_min_abs)
        if loss <= floor:
            return None
        scale = max(self.loss_diffs.median() * _DIFF_MAD_TO_SIGMA, 1e-12)
        threshold = max(floor, med + self.m.spike_mads * scale)
        if loss <= threshold:
            return None
        lr, gn = _finite(step.get("lr")), _finite(step.get("grad_norm"))
        window = self.losses.recent(10)
        evidence = {
            "loss": _r(loss), "median": _r(med), "mad_sigma": _r(scale),
            "mads": _r((loss - med) / scale, 3), "jump": _r(loss - med),
            "jump_ratio": _r(loss / med, 3) if med else None, "threshold": _r(threshold, 6),
            "window_steps": len(self.loss_diffs) + 1, "recent_losses": [_r(x) for x in window],
            "lr": _r(lr), "grad_norm": _r(gn), "grad_norm_median": _r(self.grads.median()) if len(self.grads) else None,
        }
        detail = (f"loss {loss:.4g} at step {s} vs rolling median {med:.4g} of the last {len(self.losses)} steps "
                  f"(+{loss - med:.3g}, {evidence['mads']} MADs); lr {short_num(lr)}, grad norm {short_num(gn)}")
        return Incident("loss_spike", "warn", s, f"Loss spike at step {s}", detail,
                        ADVICE["loss_spike"], evidence)

    def _grad(self, s: int, step: dict[str, Any], skipped: bool) -> Incident | None:
        gn = _finite(step.get("grad_norm"))
        if gn is None or skipped or len(self.grads) < self.m.spike_min_history:
            return None
        med = self.grads.median()
        threshold = max(self.m.grad_explosion_factor * med, self.m.grad_explosion_min_norm)
        if med > 0 and gn > threshold:
            lr = _finite(step.get("lr"))
            evidence = {"reason": "norm", "grad_norm": _r(gn), "median": _r(med),
                        "factor": _r(gn / med, 3), "threshold": _r(threshold, 6),
                        "window_steps": len(self.grads), "lr": _r(lr),
                        "loss": _r(_finite(step.get("loss"))), "grad_clip": self.grad_clip}
            detail = (f"grad norm {gn:.4g} at step {s} is {gn / med:.1f}x its rolling median {med:.4g} "
                      f"(threshold {self.m.grad_explosion_factor:g}x, at least {self.m.grad_explosion_min_norm:g}); lr {short_num(lr)}")
            return Incident("grad_explosion", "warn", s, f"Gradient explosion at step {s}", detail,
                            ADVICE["grad_explosion"], evidence)
        return None

    def _clipping(self, s: int, step: dict[str, Any], skipped: bool) -> Incident | None:
        if self.grad_clip <= 0 or not step.get("clipped"):
            return None  # no clipping configured (a script's run), or this step was not clipped
        gn = _finite(step.get("grad_norm"))
        if gn is None or skipped or len(self.grads) < self.m.spike_min_history:
            return None
        med = self.grads.median()
        lr = _finite(step.get("lr"))
        # Clipping on almost every step is normal at the very start; only judge it once the
        # run is past its first spike_window steps and the window is full.
        if self.steps_seen > self.m.spike_window and len(self.clipped) == self.clipped.maxlen:
            share = sum(self.clipped) / len(self.clipped)
            if share >= self.m.clip_active_share:
                evidence = {"clipped_share": _r(share, 3),
                            "window_steps": len(self.clipped), "grad_clip": self.grad_clip,
                            "grad_norm": _r(gn), "median": _r(med), "lr": _r(lr)}
                detail = (f"gradients clipped on {share:.0%} of the last {len(self.clipped)} steps "
                          f"(clip {self.grad_clip:g}, median grad norm {med:.3g}): the effective lr "
                          f"is far below the configured one")
                return Incident("clipping_active", "info", s, "Clipping active on most steps", detail,
                                ADVICE["clipping_active"], evidence)
        return None

    def _overflow(self, s: int, step: dict[str, Any], skipped: bool) -> Incident | None:
        if step.get("loss_scale") is None:
            return None  # no GradScaler (fp32/bf16): a skipped step there is a NaN, not an overflow
        scale = _finite(step.get("loss_scale"))
        if not self.calibrating:
            self.skipped.append(skipped)
        n_skipped = sum(self.skipped)
        collapsed = scale is not None and scale < self.m.overflow_min_scale
        if not (collapsed or n_skipped >= self.m.overflow_max_skipped):
            return None
        evidence = {"skipped_in_window": n_skipped, "window_steps": len(self.skipped),
                    "loss_scale": scale, "min_scale": self.m.overflow_min_scale,
                    "grad_norm": _r(_finite(step.get("grad_norm"))), "lr": _r(_finite(step.get("lr")))}
        if collapsed:
            detail = (f"GradScaler loss scale fell to {scale:.3g} at step {s} (below "
                      f"{self.m.overflow_min_scale:g}): gradients overflow fp16 even unscaled")
        else:
            detail = (f"{n_skipped} of the last {len(self.skipped)} steps were skipped for inf/NaN "
                      f"gradients (loss scale now {short_num(scale)})")
        return Incident("fp16_overflow", "warn", s, f"fp16 overflow: skipped steps at {s}", detail,
                        ADVICE["fp16_overflow"], evidence)


def nan_incident(step: int, lr: float, grad_norm: float, loss: float, sample_indices: list[int],
                 action: str) -> Incident:
    """The `nan_loss` incident for a step whose loss was non-finite on some rank."""
    shown = ", ".join(str(i) for i in sample_indices[:16]) + (" ..." if len(sample_indices) > 16 else "")
    what = {"skip": "the step was skipped (weights unchanged)", "rollback": "the run rolls back to the checkpoint before it"}.get(action, "the run stops")
    detail = (f"loss {loss} at step {step} (lr {lr:.3g}, grad norm {grad_norm}); {what}. "
              f"Samples in the offending micro-batch: {shown or 'unknown'}")
    evidence = {"loss": loss, "lr": _r(_finite(lr)), "grad_norm": grad_norm,
                "sample_indices": list(sample_indices), "action": action}
    return Incident("nan_loss", "error" if action == "stop" else "warn", step,
                    f"Non-finite loss at step {step}", detail, ADVICE["nan_loss"], evidence)


def recompile_incident(step: int, recompiles: list[tuple[str, str]]) -> Incident:
    """The `recompile` incident for a step in which torch.compile recompiled: (function, torch's reason) each."""
    reasons = [why.splitlines()[0][:300] for _, why in recompiles]
    n = len(recompiles)
    detail = f"torch.compile recompiled {recompiles[0][0]} at step {step}{f' ({n} recompiles)' if n > 1 else ''}: {reasons[0]}"
    evidence = {"recompiles": n, "functions": [fn for fn, _ in recompiles], "reasons": reasons}
    return Incident("recompile", "warn", step, f"Recompiled at step {step}", detail, ADVICE["recompile"], evidence)


def disk_full_incident(step: int, error: DiskFullError, reason: str, last: str, then: str, keep_last: int) -> Incident:
    """The `disk_full` incident for a checkpoint (`reason`: interval, request, final, stop) that did not fit."""
    evidence = {"path": str(error.path), "free_bytes": error.free, "needed_bytes": error.needed,
                "reason": reason, "keep_last": keep_last}
    advice = (f"Free space on that filesystem (old runs, other files), or move runs_dir to a bigger disk, "
              f"or lower [checkpoint] keep_last = {keep_last}; a stopped or failed run resumes with "
              f"`mt resume` once there is room.")
    return Incident("disk_full", "error", step, f"Checkpoint at step {step} {'failed' if reason in ('final', 'stop') else 'skipped'}: disk full",
                    f"{error}. {last[0].upper()}{last[1:]}; {then}.", advice, evidence)


def checkpoint_failed_incident(step: int, why: str, last: str, reason: str, root: Path) -> Incident:
    """The `checkpoint_failed` incident: a background (checkpoint.async) write that failed and was removed."""
    return Incident("checkpoint_failed", "error", step, f"Checkpoint at step {step} failed in the background",
                    f"{why}. The temporary folder was removed; {last}.",
                    "Check the rank logs and the checkpoints' filesystem; the next checkpoint tries again.",
                    {"reason": reason, "path": str(root)})
