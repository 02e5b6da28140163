"""Status changes in one place: NEXT_STATES in mt/contract/status.py, through `move` and `end`."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mt.contract.status import FINAL_STATES, NEXT_STATES, RUN_STATES, Status, TransitionError

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "mt" / "contract" / "status.py"


def _state_writes(source: str) -> list[int]:
    """Lines that assign `<something status>.state` (a Status's state set around move/end)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(el, ast.Attribute) and el.attr == "state" and "status" in ast.unparse(el.value).lower():
                    found.append(node.lineno)
    return found


def test_the_finder_flags_a_state_set_by_hand() -> None:
    assert _state_writes("status.state, status.reason = 'killed', 'x'\nself.status.state = 'running'\nst.state = 'x'\n") == [1, 2]


def test_no_code_sets_a_status_state_outside_the_transition_table() -> None:
    bad = []
    for top in ("mt", "tui", "engine"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path != HOME:
                bad += [f"{path.relative_to(ROOT)}:{n}" for n in _state_writes(path.read_text())]
    assert not bad, f"set a run's state with Status.move / Status.end (mt/contract/status.py NEXT_STATES): {bad}"


def test_every_state_has_its_next_states_and_a_final_run_starts_again_only_by_a_resume() -> None:
    assert set(NEXT_STATES) == {None, *RUN_STATES}
    for final in FINAL_STATES:
        assert set(NEXT_STATES[final]) == {"starting", "pending", *FINAL_STATES}


@pytest.mark.parametrize(("start", "to"), [("completed", "running"), ("killed", "stopping"), ("stopping", "running"),
                                           ("pending", "running"), ("failed", "running")])
def test_a_move_the_table_does_not_allow_is_refused_and_changes_nothing(start: str, to: str) -> None:
    status = Status(state=start, reason="as it was")
    with pytest.raises(TransitionError, match=f"{start} -> {to}"):
        status.move(to, "new")
    assert (status.state, status.reason) == (start, "as it was")


def test_end_closes_the_open_attempt_and_keeps_the_ended_ones() -> None:
    status = Status(state="running", attempts=[{"attempt": 1, "ended": 5.0, "exit_code": 1}, {"attempt": 2, "ended": None}])
    status.end("failed", "rank 0 crashed", 10.0, 1)
    assert (status.state, status.reason, status.ended, status.exit_code) == ("failed", "rank 0 crashed", 10.0, 1)
    assert status.attempts == [{"attempt": 1, "ended": 5.0, "exit_code": 1}, {"attempt": 2, "ended": 10.0, "exit_code": 1}]
