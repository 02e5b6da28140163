"""The dashboard's `=` key: a one-line input of knobs, sent as a `set` request (a bad line is said and
nothing is sent), the engine's answer in the notice line and the turned knobs in the header."""
from __future__ import annotations

import json

import pytest

from tests.tui.synth import running_run
from tests.tui.test_app import loaded, make_app, text_of, wait_for
from tui.widgets.knobinput import KnobInput

pytestmark = pytest.mark.timeout(120)


async def _type(pilot, line: str) -> None:
    await pilot.press("equals_sign")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, KnobInput))
    await pilot.press(*line)
    await pilot.press("enter")
    await wait_for(pilot, lambda: not isinstance(pilot.app.screen, KnobInput))


async def test_the_equals_key_sends_checked_knobs_and_shows_the_answer_and_the_turned_knob(tmp_path):
    r = running_run(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await _type(pilot, "lr=3")
        assert ("error", "set refused: lr: not a knob (knobs: lr_scale, grad_clip, eval_every, checkpoint_every, "
                         "log_every, skip_batches)") in app.dashboard.said
        assert not (tmp_path / "control").exists() or not list((tmp_path / "control").glob("*.json"))

        await _type(pilot, "lr_scale=0.5 skip_batches=20")
        sent = list((tmp_path / "control").glob("*.json"))
        assert len(sent) == 1
        request = json.loads(sent[0].read_text())
        assert request["action"] == "set" and request["settings"] == {"lr_scale": 0.5, "skip_batches": 20}
        assert app.dashboard.requests.pending == {request["id"]: "set"}

        with open(r.paths.events, "a") as f:   # the engine's answer, as engine/knobs.py writes it
            for kind, fields in (
                ("knob", dict(step=7, key="lr_scale", value=0.5, previous=1.0, by="user", request=request["id"])),
                ("knob", dict(step=7, key="skip_batches", value=20, previous=None, by="user", request=request["id"])),
                ("control", dict(request_id=request["id"], action="set", status="done",
                                 detail="applied from step 7: lr_scale=0.5, skip_batches=20")),
            ):
                r.event(kind, **fields)
                f.write(r.lines[-1] + "\n")
        await wait_for(pilot, lambda: not app.dashboard.requests.pending)
        assert ("information", "set applied from step 7: lr_scale=0.5, skip_batches=20") in app.dashboard.said
        await wait_for(pilot, lambda: "knobs lr×0.5" in text_of(app, "#header"))
        assert "skip" not in text_of(app, "#header")   # a skip is done once, not a setting to show
