"""The knobs' one parser and the state a checkpoint keeps (mt/contract/knobs.py)."""
from __future__ import annotations

import pytest

from mt.contract.knobs import KnobError, Knobs, parse_setting


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
