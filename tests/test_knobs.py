"""The knobs' one parser and the state a checkpoint keeps (mt/contract/knobs.py)."""
from __future__ import annotations

import json

import pytest

from mt.contract.knobs import KnobError, Knobs, parse_setting, parse_settings


@pytest.mark.parametrize(("text", "expected"), [("lr_scale=0.5", ("lr_scale", 0.5)), (" log_every = 10 ", ("log_every", 10)),
                                                ("grad_clip=0", ("grad_clip", 0.0)), ("skip_batches=3", ("skip_batches", 3))])
def test_a_good_setting_parses_to_its_type(text: str, expected: tuple) -> None:
    key, value = parse_setting(text)
    assert (key, value) == expected and type(value) is type(expected[1])


@pytest.mark.parametrize(("text", "says"), [("lr_scale", "KEY=VALUE"), ("lr=3", "not a knob"), ("lr_scale=0", "> 0"),
                                            ("lr_scale=nan", "not finite"), ("log_every=0", ">= 1"),
                                            ("eval_every=2.5", "whole number"), ("grad_clip=-1", ">= 0")])
def test_a_bad_setting_is_one_line_naming_the_key(text: str, says: str) -> None:
    with pytest.raises(KnobError) as e:
        parse_setting(text)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_only_turned_knobs_are_kept_and_an_odd_state_falls_back_to_the_preset() -> None:
    knobs = Knobs()
    assert knobs.to_state() == {}
    knobs.set("lr_scale", 0.25)
    knobs.set("eval_every", 5)
    assert Knobs.from_state(knobs.to_state()) == knobs
    assert Knobs.from_state({"lr_scale": -1, "log_every": "x", "bogus": 1, "grad_clip": 0.5}) == Knobs(grad_clip=0.5)
    assert Knobs.from_state(None) == Knobs() == Knobs.from_state([1, 2])
    with pytest.raises(KnobError):
        knobs.set("skip_batches", 2)


@pytest.mark.parametrize(("settings", "says"), [(None, "carries settings"), ({}, "carries settings"), ([1], "carries settings"),
                                                ({"lr": 1}, "lr: not a knob"), ({"skip_batches": 0}, "must be >= 1"),
                                                ({"log_every": True}, "not a whole number")])
def test_a_set_request_without_good_settings_is_rejected_by_the_inbox(tmp_path, settings, says) -> None:
    from mt.contract.inbox import ControlInbox

    inbox = ControlInbox(tmp_path / "control")
    (tmp_path / "control" / "s.json").write_text(json.dumps({"id": "s", "action": "set", "settings": settings}))
    polled = inbox.poll()
    assert not polled.requests and len(polled.rejected) == 1 and says in polled.rejected[0][2]
    assert (tmp_path / "control" / "processed" / "s.json").exists()


def test_a_good_set_request_carries_its_checked_settings_and_a_reader_may_refuse_the_action(tmp_path) -> None:
    from mt.contract.inbox import ControlInbox

    inbox = ControlInbox(tmp_path / "control")
    (tmp_path / "control" / "s.json").write_text(json.dumps({"id": "s", "action": "set", "settings": {"log_every": 5.0}}))
    (tmp_path / "control" / "c.json").write_text(json.dumps({"id": "c", "action": "checkpoint"}))
    polled = inbox.poll()
    assert sorted((r.id, r.settings) for r in polled.requests) == [("c", {}), ("s", {"log_every": 5})]
    (tmp_path / "control" / "t.json").write_text(json.dumps({"id": "t", "action": "set", "settings": {"lr_scale": 2}}))
    polled = ControlInbox(tmp_path / "control").poll(refuse={"set": "no knobs here"})
    # a new reader (a script's library) finds s and t still waiting: both refused, moved out
    assert [r.id for r in polled.requests] == ["c"] and sorted((r[0], r[2]) for r in polled.rejected) == [
        ("s", "s.json: no knobs here"), ("t", "t.json: no knobs here")]


def test_several_settings_parse_together_and_a_key_twice_is_refused() -> None:
    assert parse_settings(["lr_scale=0.5", "skip_batches=20"]) == {"lr_scale": 0.5, "skip_batches": 20}
    for texts, says in ((["log_every=2", "log_every=3"], "log_every: given twice"), ([], "no setting")):
        with pytest.raises(KnobError, match=says):
            parse_settings(texts)
