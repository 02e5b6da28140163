"""Reading W&B's offline files back with wandb's own reader (wandb.sdk.internal.datastore, wandb < 0.22)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass
class OfflineRun:
    """One .wandb file: its run record's id and project, and each history row."""

    path: Path
    run_id: str = ""
    project: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)


def offline_runs(wandb_dir: Path) -> list[OfflineRun]:
    """Every offline run file under wandb_dir, oldest first."""
    datastore = pytest.importorskip("wandb.sdk.internal.datastore", reason="wandb's offline-file reader (wandb < 0.22)")
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for f in sorted(wandb_dir.glob("**/offline-run-*/run-*.wandb")):
        run = OfflineRun(f)
        ds = datastore.DataStore()
        ds.open_for_scan(str(f))
        while (data := ds.scan_data()) is not None:
            rec = pb.Record()
            rec.ParseFromString(data)
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                run.run_id, run.project = rec.run.run_id, rec.run.project
            elif kind == "history":
                run.rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        out.append(run)
    return out


def series(runs: list[OfflineRun], key: str) -> list[tuple[int, float]]:
    """(step, value) of one key over every file in order."""
    return [(row["_step"], row[key]) for run in runs for row in run.rows if key in row]
