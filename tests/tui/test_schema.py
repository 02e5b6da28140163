"""The event schema table (mt/contract/events.py SCHEMA) against everything written from it: the parser,
the fast paths (the index's step record, the scanner's regex, the script's step batch), the
builders both producers call, and the contract page (docs/events.md)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from mt.contract import builders
from mt.contract.eventindex import RECORD, encode, step_record
from mt.contract.events import EVENT_FIELDS, SCHEMA, Field, make_event
from mt.contract.records import Rejected, Step, parse_event, parse_incident
from mt.stepbatch import StepBatch
from mt.values import step_number
from tui.read.columns import COLS, _step_pattern

MISSING = object()
T = 1.8e9 + 0.25
_TYPED = {"int": 4, "float": 2.5, "str": "s", "bool": True, "object": {"k": 1}, "list": ["x"]}


def good(f: Field) -> Any:
    """A value of `f` every reader takes."""
    return {"whole": max(f.lo, 3), "number": 1.5, "time": T, "text": "x", "choice": f.choices[0] if f.choices else "",
            "values": {"a": 1.0}, "strings": ["r1"], "object": {"a": 1}, "flag": True}.get(f.rule, _TYPED[f.type])


def bad(f: Field) -> list[Any]:
    """Values of `f` its rule refuses: a wrong type, then values no line may hold."""
    if f.rule == "whole":
        return ["3", 1.5, True, [1], {"a": 1}, f.lo - 1, 1 << 63]
    if f.rule == "number":
        return ["x", "3", [1], True, {"a": 1}, *([-0.5] if f.nonneg else [])]
    if f.rule == "time":
        return ["x", True, 5.0, 5e9]
    if f.rule in ("text", "choice"):
        return [7, ["x"], True, *(["bogus"] if f.rule == "choice" else [])]
    if f.rule == "values":
        return [[1], [], "x", "", 5, 0, False, {"a": "x"}, {"a": [1]}]
    if f.rule == "strings":
        return ["r", [1], {"a": 1}]
    if f.rule == "object":
        return [[1], "x", 5]
    if f.rule == "flag":
        return ["yes", 1, None]
    return []


def base(kind: str) -> dict[str, Any]:
    return {"v": 1, "t": T, "kind": kind, **{f.name: good(f) for f in SCHEMA[kind]}}


def variants() -> Iterator[tuple[str, Field, Any, bool]]:
    """(kind, field, value, whether the parser takes the line) for every field of every kind."""
    for kind, fields in SCHEMA.items():
        for f in fields:
            yield kind, f, good(f), True
            for v in bad(f):
                yield kind, f, v, f.soft
            for v in (None, MISSING):
                yield kind, f, v, not f.key


@pytest.mark.parametrize("kind", list(SCHEMA))
def test_a_line_of_good_values_parses_as_its_kind(kind: str) -> None:
    rec = parse_event(base(kind))
    assert not isinstance(rec, Rejected) and rec.kind == kind, rec
    assert not isinstance(parse_event(json.dumps(base(kind))), Rejected)
    assert EVENT_FIELDS[kind] == tuple(f.name for f in SCHEMA[kind] if f.required)
    make_event(kind, **{f.name: good(f) for f in SCHEMA[kind] if f.required})  # the writer's check agrees


def test_every_field_of_every_kind_is_judged_by_its_rule_in_the_table() -> None:
    """A missing key field, a wrong type and a value no line may hold each reject the line, naming
    the field; a soft field's odd value is dropped, the line kept; anything else missing is unknown."""
    n = 0
    for kind, f, value, takes in variants():
        line = base(kind)
        if value is MISSING:
            del line[f.name]
        else:
            line[f.name] = value
        # an incident with a status: a line of incidents.jsonl, whose parser is parse_incident
        parse = parse_incident if kind == "incident" and "status" in line else parse_event
        for rec in (parse(line), parse(json.dumps(line).encode())):
            n += 1
            assert isinstance(rec, Rejected) != takes, (kind, f.name, value, rec)
            if isinstance(rec, Rejected):
                assert rec.reason.startswith(f"{kind}: "), rec
                assert re.search(rf"\b({f.name}|a)\b", rec.reason), rec
                if value is None or value is MISSING:
                    assert rec.reason == f"{kind}: {f.name} is missing"
            elif f.soft and value is not good(f) and value is not MISSING:
                assert getattr(rec, f.name) in (None, False), (kind, f.name, value)
    assert n > 600


# ---- the fast paths agree with the parser on lines derived from the table ----------------------
def step_lines() -> Iterator[dict[str, Any]]:
    """Step events as the engine writes them (every field), one field changed at a time."""
    plain = {**base("step"), "extra": None}
    yield plain
    for f in SCHEMA["step"]:
        for v in [good(f), *bad(f), None, MISSING, *([5.0, 1 << 53] if f.rule == "whole" else []),
                  *(["nan", "inf", "-inf", math.nan, math.inf, 1e300, 0] if f.rule == "number" else [])]:
            ev = dict(plain)
            if v is MISSING:
                del ev[f.name]
            else:
                ev[f.name] = v
            yield ev
    for over in ({"v": 2}, {"v": None}, {"t": 5.0}, {"t": "x"}, {"t": 1e9 + 7}, {"kind": "eval"}):
        yield {**plain, **over}


def covered(ev: dict[str, Any], floats_only: bool) -> bool:
    """The event holds only what a fast path is built to take (plain ints and floats, no tables)."""
    if ev.get("v") != 1 or type(ev.get("t")) is not float or ev.get("kind") != "step":
        return False
    for f in SCHEMA["step"]:
        v = ev.get(f.name)
        if f.rule == "whole" and v is not None and (type(v) is not int or v >= 1 << 53):
            return False
        if f.rule == "number" and v is not None and (type(v) is not float or floats_only and not math.isfinite(v)):
            return False
        if f.rule == "values" and v is not None:
            return False
    return True


def test_the_index_fast_path_takes_what_the_parser_takes_and_nothing_it_rejects() -> None:
    took = 0
    for ev in step_lines():
        rec = parse_event(ev)
        fast = step_record(ev, 100)
        if isinstance(rec, Rejected):
            assert fast is None, (ev, rec)
            continue
        if fast is not None:
            took += 1
            assert fast == encode(rec, 100), ev
        elif isinstance(rec, Step) and rec.is_row:
            assert not covered(ev, floats_only=False), ev
    assert took > 50


def test_the_scanner_regex_takes_what_the_parser_takes_and_nothing_it_rejects() -> None:
    learned = (json.dumps({**base("step"), "extra": None}, separators=(",", ":"))).encode()
    pattern = _step_pattern(learned)
    assert pattern is not None and pattern.match(learned)
    took = 0
    for ev in step_lines():
        line = json.dumps(ev, separators=(",", ":")).encode()
        rec = parse_event(line)
        m = pattern.match(line)
        if isinstance(rec, Rejected) or not (isinstance(rec, Step) and rec.is_row):
            assert m is None, (line, rec)
            continue
        if m is not None:
            took += 1
            got = {k: float(v.strip(b'"')) if v != b"null" else None for k, v in m.groupdict().items()}
            want = {c: getattr(rec, c) for c in COLS}
            assert all(got[c] == want[c] or (got[c] is not None and math.isnan(got[c]) and math.isnan(want[c]))
                       for c in COLS), line
        elif set(ev) == set(json.loads(learned)) and covered(ev, floats_only=True):
            pytest.fail(f"the regex declines a plain line the parser takes: {line!r}")
    assert took > 50


def test_the_script_step_batch_indexes_only_lines_the_parser_takes() -> None:
    bases = (7, T, 0.5, 2.5, 1e-3, 0.5, 1024.0, None, 1, 1.25)
    odd: dict[int, list[Any]] = {0: [0, 1 << 53, (1 << 63) - 1, 1 << 63, -1], 1: [5.0, 5e9, math.nan],
                                 2: [None, 0.0, -1.0, math.inf], 3: [None, math.nan, math.inf, -math.inf, -2.0],
                                 4: [None, 0.0, -1.0, math.nan, math.inf], 5: [None, -1.0, math.nan],
                                 6: [None, 0.0, -5.0, 1e300], 7: [{"acc": 1.0}, {"acc": math.nan}, {}], 9: [None, 0.0, 3.0]}
    batch, cases = StepBatch(), []
    for i, values in odd.items():
        for v in values:
            case = list(bases)
            case[i] = v
            cases.append(tuple(case))
            batch.note(tuple(case))  # type: ignore[arg-type]
    lines, rows, _ = batch.drain()
    took = 0
    for case, line, row in zip(cases, lines, rows):
        rec = parse_event(line)
        if row is None:
            assert isinstance(rec, Rejected) or not rec.is_row or not covered(json.loads(line), floats_only=False), case
            continue
        took += 1
        assert not isinstance(rec, Rejected) and rec.is_row, (case, rec)
        assert RECORD.pack(100, *row) == encode(rec, 100), case
    assert took > 10


def test_the_library_checks_step_values_by_the_tables_rules() -> None:
    for f in SCHEMA["step"]:
        if f.name not in ("loss", "lr", "grad_norm"):
            continue
        for v in (-1.0, 1.5, math.nan, "x", [1]):
            parsed = parse_event({**base("step"), f.name: v})
            try:
                step_number(v, f.name)
                refused = False
            except (TypeError, ValueError):
                refused = True
            assert refused == isinstance(parsed, Rejected), (f.name, v)


# ---- one builder per kind, both producers ------------------------------------------------------
def test_the_engine_and_the_library_build_run_start_with_the_same_keys() -> None:
    """Both call builders.run_start (engine/train.py, mt/run.py): its keys are the table's required
    fields in order, then the extras the caller names, each a schema field."""
    root = Path(__file__).resolve().parents[2]
    for path in ("engine/train.py", "mt/run.py"):
        text = (root / path).read_text()
        assert text.count('emit("run_start"') == 1 and 'emit("run_start", **event_fields.run_start(' in text, path
    required = dict.fromkeys(EVENT_FIELDS["run_start"], 1)
    args = {k: v for k, v in required.items() if k != "nnodes"}
    fields = builders.run_start(**args, local_world_size=1, source="script")  # type: ignore[arg-type]
    assert list(fields) == [*EVENT_FIELDS["run_start"], "source"]
    with pytest.raises(ValueError, match="no field"):
        builders.run_start(**args, local_world_size=1, sourc="script")  # type: ignore[arg-type]
    assert builders.run_start(**{**args, "world_size": 8}, local_world_size=4)["nnodes"] == 2  # type: ignore[arg-type]


def test_a_checkpoint_and_its_answers_are_built_as_the_docs_say() -> None:
    script = builders.checkpoint(3, "/r/x.pt", 10, None, "request", ["a", "b"])
    engine = builders.checkpoint(3, "/r/x.pt", 10, 0.5, "request", ["a"], blocking_s=0.25)
    assert list(script) == ["step", "path", "bytes", "seconds", "reason", "request_id", "request_ids"]
    assert list(engine) == ["step", "path", "bytes", "seconds", "blocking_s", "reason", "request_id", "request_ids"]
    assert script["request_id"] == "a" and builders.checkpoint(3, "p", None, None, "script", [])["request_id"] is None
    for fields in (script, engine, builders.saved("a", "checkpoint", 3, "/r/x.pt"), builders.accepted("a", "stop", 4)):
        kind = "checkpoint" if "path" in fields else "control"
        assert not isinstance(parse_event(make_event(kind, **fields)), Rejected)
    assert builders.accepted("a", "stop", 4)["detail"] == "at step 4"


# ---- the contract page -------------------------------------------------------------------------
def rule_text(f: Field) -> str:
    """A field's rule as docs/events.md's table of fields writes it."""
    text = {"whole": f"whole >= {f.lo}", "number": "number >= 0" if f.nonneg else "number", "time": "time",
            "text": "text", "choice": "one of " + ", ".join(f.choices), "values": "{name: number}",
            "strings": "list of strings", "object": "object", "flag": "only true is true", "free": "-"}[f.rule]
    return text + (", else dropped" if f.soft and f.rule != "flag" else "")


def table_rows() -> list[str]:
    return [f"| `{kind}` | `{f.name}` | {f.type} | {rule_text(f)} | {'key' if f.key else 'required' if f.required else 'extra'} |"
            for kind, fields in SCHEMA.items() for f in fields]


def test_the_docs_table_of_fields_is_the_schema() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "events.md").read_text()
    rows = [line for line in docs.splitlines() if re.match(r"\| `[a-z_]+` \| `[a-z_]+` \|", line)]
    assert rows == table_rows()


# ---- the table is the parser ---------------------------------------------------------------------
def test_a_field_added_to_the_table_is_judged_with_no_parser_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kind's record is built from SCHEMA alone: a new field of any kind (the incident's own
    parser aside) is judged by its rule at once, a soft one's odd value dropped."""
    for kind in (k for k in SCHEMA if k != "incident"):
        count = Field("new_count", "int", "whole", False, lo=2)
        tag = Field("new_tag", "str", "choice", False, choices=("a", "b"), soft=True)
        monkeypatch.setitem(SCHEMA, kind, (*SCHEMA[kind], count, tag))
        assert not isinstance(parse_event(base(kind)), Rejected), kind
        rec = parse_event({**base(kind), "new_count": 1})
        assert isinstance(rec, Rejected) and rec.reason == f"{kind}: new_count 1 is out of range", (kind, rec)
        assert not isinstance(parse_event({**base(kind), "new_tag": "c"}), Rejected), kind
        assert isinstance(parse_event({**base(kind), "new_tag": 5, "new_count": "x"}), Rejected), kind


def test_each_record_holds_fields_of_its_kind_only() -> None:
    """A record restates no field: each of its fields is one of its kind's in the table."""
    from dataclasses import fields

    from mt.contract import records
    for cls in (records.RunStart, Step, records.Eval, records.Metrics, records.Checkpoint, records.ControlEvent, records.RunEnd):
        names = {f.name for f in fields(cls)} - {"t", "raw"}
        assert names <= {f.name for f in SCHEMA[cls.kind]}, (cls.kind, names - {f.name for f in SCHEMA[cls.kind]})
