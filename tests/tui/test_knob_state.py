"""A turned grad_clip moves the grad-norm plot's clip line; the header lists the turned knobs."""
from __future__ import annotations

from pathlib import Path

from mt.contract.records import parse_event
from tui.state.runstate import new_state, reduce_event


def knob(step: int, key: str, value: float, previous: float) -> object:
    return parse_event({"kind": "knob", "v": 1, "t": 1.8e9, "step": step, "key": key, "value": value, "previous": previous,
                        "by": "user", "request": "r1"})


def test_the_clip_line_follows_a_turned_grad_clip_and_zero_removes_it(tmp_path: Path) -> None:
    st = new_state(tmp_path)
    st.grad_clip = 1.0  # the preset's, from run_start
    reduce_event(st, knob(10, "grad_clip", 0.5, 1.0))
    assert st.grad_clip == 0.5 and st.knobs == {"grad_clip": 0.5}
    reduce_event(st, knob(20, "lr_scale", 0.25, 1.0))
    assert st.grad_clip == 0.5 and st.knobs == {"grad_clip": 0.5, "lr_scale": 0.25}
    reduce_event(st, knob(30, "grad_clip", 0.0, 0.5))   # 0 disables clipping: no line
    assert st.grad_clip is None
