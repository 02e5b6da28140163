"""presets/demos/: one valid, watchable CPU preset per fault (the e2e tests run the same faults)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mt.contract.config import FaultsConfig
from mt.contract.preset import load_preset

DEMOS = Path(__file__).resolve().parents[2] / "presets" / "demos"
# demo file -> the [faults] keys it must set (the code it shows is in its header comment)
EXPECTED = {
    "dataloader-stall.toml": ("dataloader_stall", {"stall_at_step", "stall_seconds"}),
    "nan-loss.toml": ("nan_loss", {"nan_at_step"}),
    "crash.toml": ("crash", {"crash_at_step"}),
    "hang.toml": ("hang", {"hang_at_step"}),
    "fp16-overflow.toml": ("fp16_overflow", {"overflow_at_step"}),
    "clean.toml": (None, set()),
}


def test_every_demo_is_listed() -> None:
    assert {p.name for p in DEMOS.glob("*.toml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_demo_preset(name: str) -> None:
    cfg = load_preset(DEMOS / name)
    code, keys = EXPECTED[name]
    default = vars(FaultsConfig())  # the keys the demo set: a value its default does not have
    faults = {k for k, v in vars(cfg.faults).items() if v and v != default[k] and k != "step_sleep_s"}
    assert keys <= faults and (faults - {"crash_rank", "hang_rank"}) <= keys | {"stall_seconds"}
    assert cfg.launch.device == "cpu" and cfg.faults.step_sleep_s > 0  # small, and slow enough to watch
    header = (DEMOS / name).read_text().splitlines()[0]
    assert (code or "clean") in header
    for key in ("stall_at_step", "nan_at_step", "crash_at_step", "hang_at_step", "overflow_at_step"):
        at = getattr(cfg.faults, key)
        # the fault strikes after the rules have history, and well before the end
        assert at == 0 or 20 <= at <= cfg.train.max_steps - 20
