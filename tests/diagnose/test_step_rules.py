"""Rank 0's rules inside training (mt/rules.py): fire on the fault, at its step, once; silent otherwise."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from mt.contract.config import MonitorConfig
from mt.contract.events import INCIDENT_CODES, dumps, make_event, schema_errors
from mt.rules import RollingMedian, StepRules, is_clear, nan_incident

from .streams import steps

SEEDS = range(12)


def run(stream: list[dict], monitor: MonitorConfig | None = None, grad_clip: float = 1.0) -> list[dict]:
    sa = StepRules(monitor or MonitorConfig(), grad_clip)
    out = []
    for s in stream:
        out += sa.observe(s)
    return out


def test_rolling_median_matches_sorting() -> None:
    rm = RollingMedian(7)
    xs = [5, 1, 9, 3, 3, 8, 2, 7, 6, 4, 0]
    for i, x in enumerate(xs):
        rm.add(float(x))
        win = sorted(xs[max(0, i - 6): i + 1])
        n = len(win)
        want = win[n // 2] if n % 2 else (win[n // 2 - 1] + win[n // 2]) / 2
        assert rm.median() == want
    assert rm.recent(3) == [float(x) for x in xs[-3:]]


@pytest.mark.parametrize("seed", SEEDS)
def test_clean_curves_raise_nothing(seed: int) -> None:
    # early fall from ln(256), noise, warmup, occasional 2-3x grad bumps, clipping early on
    assert run(steps(400, seed)) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_noisier_and_flat_curves_raise_nothing(seed: int) -> None:
    assert run(steps(300, seed, noise=0.1)) == []
    assert run(steps(300, seed, start=2.0, floor=2.0, noise=0.01)) == []


def test_resume_mid_run_raises_nothing() -> None:
    # a resumed attempt starts with an empty history at step 201 of the same curve
    for seed in SEEDS:
        assert run(steps(150, seed, first_step=201)) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_loss_spike_fires_once_at_its_step(seed: int) -> None:
    stream = steps(200, seed)
    at = 120
    base = stream[at - 1]["loss"]
    for k in range(at - 1, at + 4):  # a five-step spike to ~2.5x, then recovery
        stream[k]["loss"] = base * 2.5
    got = run(stream)
    assert [i.code for i in got] == ["loss_spike"]
    inc = got[0]
    assert inc.step == at and inc.severity == "warn"
    ev = inc.evidence
    assert ev["loss"] == pytest.approx(base * 2.5, rel=1e-3)
    assert ev["lr"] == pytest.approx(stream[at - 1]["lr"], rel=1e-3)
    assert ev["grad_norm"] == pytest.approx(stream[at - 1]["grad_norm"], rel=1e-3)
    assert ev["jump"] == pytest.approx(ev["loss"] - ev["median"], rel=1e-2)
    assert len(ev["recent_losses"]) == 10
    assert set(inc.event_fields()) == {"step", "code", "severity", "title", "detail", "advice", "evidence"}
    assert "lr" in inc.advice and "warmup" in inc.advice


def test_spike_during_initial_history_is_not_judged() -> None:
    m = MonitorConfig()
    stream = steps(100, 3)
    stream[m.spike_min_history - 2]["loss"] *= 3  # before min history: cannot tell noise apart
    assert run(stream, m) == []


def test_spike_reopens_after_it_clears() -> None:
    m = MonitorConfig()
    stream = steps(300, 5)
    for at in (100, 200):
        stream[at - 1]["loss"] *= 3
    got = run(stream, m)
    assert [(i.code, i.step) for i in got] == [("loss_spike", 100), ("loss_spike", 200)]


def test_spike_not_repeated_while_open() -> None:
    stream = steps(200, 7)
    for k in range(100, 140):  # a sustained blow-up: every step is "a spike"
        stream[k]["loss"] = 12.0 + k * 0.01
    got = run(stream)
    assert [i.step for i in got if i.code == "loss_spike"] == [101]


@pytest.mark.parametrize("seed", SEEDS)
def test_grad_explosion_fires_on_norm_jump(seed: int) -> None:
    stream = steps(200, seed)
    stream[149]["grad_norm"] = 50 * stream[148]["grad_norm"] + 20
    got = run(stream)
    assert [(i.code, i.step) for i in got] == [("grad_explosion", 150)]
    ev = got[0].evidence
    assert ev["reason"] == "norm" and ev["factor"] > MonitorConfig().grad_explosion_factor


def test_clipping_on_most_steps_is_reported_only_after_the_start() -> None:
    m = MonitorConfig()
    stream = steps(300, 1)
    for s in stream:  # clip threshold far below every norm: clipping on every step
        s["clipped"] = True
    got = run(stream, m, grad_clip=0.01)
    assert [i.code for i in got] == ["clipping_active"]  # its own code: not an explosion
    assert got[0].step == m.spike_window + 1 and got[0].severity == "info"
    assert got[0].evidence["clipped_share"] == 1.0 and "grad_clip" in got[0].advice
    assert schema_errors(make_event("incident", **got[0].event_fields())) == []


def fp16(stream: list[dict], scale: float = 65536.0) -> list[dict]:
    for s in stream:
        s["loss_scale"] = scale
    return stream


def test_fp16_calibration_skips_at_start_are_not_overflow() -> None:
    stream = fp16(steps(200, 2))
    for k in range(6):  # GradScaler halving from 2**16 on the first steps
        stream[k]["skipped"] = True
        stream[k]["loss_scale"] = 65536.0 / 2 ** (k + 1)
    assert run(stream) == []


def test_fp16_overflow_fires_on_repeated_skips() -> None:
    m = MonitorConfig()
    stream = fp16(steps(200, 2))
    skips = [100, 103, 106, 109, 112, 115]
    for s in skips:
        stream[s - 1]["skipped"] = True
        stream[s - 1]["grad_norm"] = float("inf")
    got = run(stream, m)
    assert [(i.code, i.step) for i in got] == [("fp16_overflow", skips[m.overflow_max_skipped - 1])]
    assert got[0].evidence["skipped_in_window"] == m.overflow_max_skipped


def test_fp16_scale_collapse() -> None:
    m = MonitorConfig()
    stream = fp16(steps(100, 2))
    for k in range(60, 100):
        stream[k]["loss_scale"] = 2.0 ** (-(k - 59))
    got = run(stream, m)
    first_low = next(s["step"] for s in stream if s["loss_scale"] < m.overflow_min_scale)
    assert [(i.code, i.step) for i in got] == [("fp16_overflow", first_low)]


def test_skipped_nan_steps_in_fp32_are_not_fp16_overflow() -> None:
    stream = steps(100, 4)
    for k in range(50, 60):  # the engine skips non-finite steps; without a scaler that is NaN
        stream[k].update(loss=float("nan"), grad_norm=float("nan"), skipped=True)
    assert run(stream) == []


def test_nan_loss_is_left_to_nan_incident() -> None:
    stream = steps(100, 4)
    stream[50]["loss"] = float("nan")
    stream[50]["grad_norm"] = float("nan")
    assert run(stream) == []


def test_nan_incident_fields_and_json() -> None:
    inc = nan_incident(37, 2.5e-3, float("nan"), float("nan"), [4, 91, 1022], "skip")
    assert inc.code == "nan_loss" and inc.code in INCIDENT_CODES and inc.step == 37
    assert inc.severity == "warn"
    assert nan_incident(37, 1e-3, 1.0, float("inf"), [1], "stop").severity == "error"
    assert inc.evidence["sample_indices"] == [4, 91, 1022]
    assert "91" in inc.detail and "37" in inc.detail
    line = dumps(inc.event_fields())  # must survive the event writer: no bare NaN in JSON
    assert "NaN" not in line and '"nan"' in line


def test_is_clear_reads_event_strings() -> None:
    assert not is_clear("nan_loss", {}, {"loss": "nan"})
    assert is_clear("nan_loss", {}, {"loss": 2.0})
    assert not is_clear("loss_spike", {"threshold": 3.0}, {"loss": 3.5})
    assert is_clear("loss_spike", {"threshold": 3.0}, {"loss": 2.5})
    assert not is_clear("fp16_overflow", {"min_scale": 1.0}, {"skipped": True, "loss_scale": 8.0})


def test_observe_is_cheap() -> None:
    import time
    stream = steps(5000, 0)
    sa = StepRules(MonitorConfig(), 1.0)
    t0 = time.perf_counter()
    for s in stream:
        sa.observe(s)
    per_step = (time.perf_counter() - t0) / len(stream)
    assert per_step < 1e-3, per_step  # generous: a few us in practice, the step itself is ms


@pytest.mark.parametrize("module", ["mt.rules", "tui.diagnose.monitor", "tui.diagnose.rules"])
def test_diagnosis_never_imports_torch(module: str) -> None:
    code = f"import sys, {module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_math_sanity_of_streams() -> None:
    # the synthetic curve really has the early fall the rules must tolerate
    s = steps(100, 0)
    assert s[0]["loss"] > 1.5 * s[-1]["loss"] and all(math.isfinite(x["loss"]) for x in s)


def converged(seed: int) -> list[dict]:
    """A run that converges to ~1e-4: noise and 10-30x grad-norm jumps that are large only relatively."""
    stream = steps(400, seed, start=3.0, floor=1e-4, tau=15, noise=0.6)
    for k, s in enumerate(stream[150:], 150):
        s["grad_norm"] *= 1e-3 * (25 if k % 37 == 0 else 1)
        s["clipped"] = False
        if k % 41 == 0:
            s["loss"] *= 12
    return stream


@pytest.mark.parametrize("seed", SEEDS)
def test_near_zero_loss_jumps_are_no_incidents_but_real_ones_are(seed: int) -> None:
    stream = converged(seed)
    assert run(stream) == []
    stream[300]["loss"], stream[350]["grad_norm"] = 0.8, 2.0  # above both floors: a spike and an explosion
    assert [(i.code, i.step) for i in run(stream)] == [("loss_spike", 301), ("grad_explosion", 351)]
    floors = MonitorConfig(spike_min_abs=0.0, grad_explosion_min_norm=0.0)  # the rules without them: the noise fires
    assert {i.code for i in run(converged(seed), floors)} == {"loss_spike", "grad_explosion"}
