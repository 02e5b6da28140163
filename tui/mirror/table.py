"""`mt export --csv / --parquet`: every step, eval, generated sample, metrics, system sample and incident as one table.

One row per line of the run directory (no sampling), a `kind` column saying which; the columns a
kind lacks are empty. Columns: docs/cli.md#mt-export.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from mt.contract.jsonl import JsonlTail
from mt.contract.paths import RunPaths
from mt.contract.records import Eval, Metrics, RecordTail, RunStart, Sample, Step, parse_incident
from mt.contract.system import clean_sample
from tui.format.fmt import safe_text
from tui.mirror.points import sample_values

STEP_FIELDS = ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "data_wait_s", "mfu", "samples_per_s")
INCIDENT_FIELDS = ("code", "severity", "status", "source", "title", "detail", "advice")
SAMPLE_FIELDS = ("index", "prompt", "text", "tokens")  # a generated sample's ([eval] prompts)
FIXED = ("kind", "t", "attempt", "step", *STEP_FIELDS, "val_loss")


def run_rows(paths: RunPaths) -> tuple[list[str], list[dict[str, Any]]]:
    """The run's table: (columns, rows); events first in file order, then system samples, then incidents."""
    rows: list[dict[str, Any]] = []
    attempt = None
    for rec in RecordTail(paths.events).iter_new():
        if isinstance(rec, RunStart):
            attempt = rec.attempt
        elif isinstance(rec, Step):
            rows.append({"kind": "step", "t": rec.t, "attempt": attempt, "step": rec.step,
                         **{k: getattr(rec, k) for k in STEP_FIELDS}, **_named(rec.extra)})
        elif isinstance(rec, Eval):
            rows.append({"kind": "eval", "t": rec.t, "attempt": attempt, "step": rec.step, "val_loss": rec.val_loss,
                         **_named({f"eval/{k}": v for k, v in rec.metrics.items()})})
        elif isinstance(rec, Sample):
            rows.append({"kind": "sample", "t": rec.t, "attempt": attempt, "step": rec.step,
                         **{k: getattr(rec, k) for k in SAMPLE_FIELDS}})
        elif isinstance(rec, Metrics):
            rows.append({"kind": "metrics", "t": rec.t, "attempt": attempt, "step": rec.step, **_named(rec.values)})
    for raw in JsonlTail(paths.system).iter_new():
        sample = clean_sample(raw)
        if sample is not None:
            rows.append({"kind": "system", "t": sample["t"], **sample_values(sample)})
    for inc in RecordTail(paths.incidents, parse=parse_incident).iter_new():
        rows.append({"kind": "incident", "t": inc.t, "step": inc.step, **{k: getattr(inc, k) for k in INCIDENT_FIELDS}})
    seen = {k for row in rows for k in row}
    extra = sorted(k for k in seen if k.startswith("metrics/")) + sorted(k for k in seen if "/" in k and not k.startswith("metrics/"))
    samples = [*SAMPLE_FIELDS] if any(row["kind"] == "sample" for row in rows) else []
    return [*FIXED, *extra, *INCIDENT_FIELDS, *samples], rows


def _named(values: dict[str, float]) -> dict[str, float]:
    return {f"metrics/{k}": v for k, v in values.items()}


def write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """The table as CSV; every text cell (and column name) through `csv_cell`, numbers as they are."""
    with open(path, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
        w = csv.writer(f)
        w.writerow([csv_cell(c) for c in columns])
        w.writerows([csv_cell(row.get(c, "")) for c in columns] for row in rows)


_FORMULA_START = ("=", "+", "-", "@", "\t")   # and CR, which safe_text has escaped already


def csv_cell(value: Any) -> Any:
    """A text cell a spreadsheet shows as text, never runs (OWASP's CSV injection advice): a leading
    = + - @ or tab gets a `'` before it; CR, NUL and the other control characters become `\\x0d`,
    `\\x00` (newlines and tabs stay: a quoted cell holds them). Numbers stay numbers: a loss of -1.5."""
    if not isinstance(value, str):
        return value
    value = safe_text(value, lines=True)   # keeps newlines and tabs, which a quoted CSV cell holds
    return "'" + value if value.startswith(_FORMULA_START) else value


def write_parquet(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """Typed columns (strings, whole numbers, floats); needs the parquet extra (pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"kind": pa.string(), "attempt": pa.int64(), "step": pa.int64(), **dict.fromkeys(INCIDENT_FIELDS, pa.string()),
             "index": pa.int64(), "tokens": pa.int64(), "prompt": pa.string(), "text": pa.string()}
    schema = pa.schema([(c, types.get(c, pa.float64())) for c in columns])
    table = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows], schema=schema)
    pq.write_table(table, str(path))
