"""`mt replay`'s reports (RUN/replay/step-S/report.json), read through the door, bounded, and said in words:
the cause an incident gains (docs/run-directory.md#replay)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mt.contract import door
from mt.contract.events import as_float, as_int
from mt.contract.fmt import NA
from mt.contract.paths import RunPaths
from tui.state.runstate import REPLAY_CODES as REPLAY_CODES  # re-exported: the codes a replay explains

REPORT_BYTES = 1 << 20
"""A report is small (no per-step series beyond the replayed losses): anything bigger is not one."""
PHASES = {"forward": "forward output", "backward": "gradient", "loss": "loss"}


def replay_dir(run_dir: Path) -> Path:
    return RunPaths(Path(run_dir)).root / "replay"


def report_path(run_dir: Path, step: int) -> Path:
    return replay_dir(run_dir) / f"step-{step}" / "report.json"


@dataclass(frozen=True)
class ReplayReport:
    """What a replay found (the fields of report.json this side reads; docs/run-directory.md#replay)."""

    step: int
    kind: str                          # nonfinite | spike | none
    module: str = ""
    phase: str = ""
    rank: int | None = None
    micro_batch: int | None = None
    bad_step: int | None = None
    sample_indices: list[int] = field(default_factory=list)
    ratio: float | None = None
    reproduced: bool | None = None     # None: no logged loss to compare
    compared: int = 0
    difference: dict[str, Any] | None = None
    from_step: int | None = None

    @classmethod
    def of(cls, raw: Any) -> ReplayReport | None:
        """A report from its parsed JSON; None for anything that is not one."""
        if not isinstance(raw, dict) or as_int(raw.get("step")) is None or raw.get("kind") not in ("nonfinite", "spike", "none"):
            return None
        indices = raw.get("sample_indices")
        ratio = raw.get("ratio")
        reproduced = raw.get("reproduced")
        return cls(step=as_int(raw["step"]) or 0, kind=raw["kind"], module=str(raw.get("module") or ""),
                   phase=str(raw.get("phase") or ""), rank=as_int(raw.get("rank")), micro_batch=as_int(raw.get("micro_batch")),
                   bad_step=as_int(raw.get("bad_step")),
                   sample_indices=[i for i in (as_int(v) for v in indices) if i is not None] if isinstance(indices, list) else [],
                   ratio=as_float(ratio) if ratio is not None else None,
                   reproduced=reproduced if isinstance(reproduced, bool) else None, compared=as_int(raw.get("compared")) or 0,
                   difference=raw.get("difference") if isinstance(raw.get("difference"), dict) else None,
                   from_step=as_int(raw.get("from_step")))

    def cause(self) -> str:
        """One line: the module and where (the cause an incident shows)."""
        if self.kind == "none":
            return "replay found no non-finite value and no jump"
        what = PHASES.get(self.phase, self.phase)
        if self.kind == "nonfinite":
            head = "the loss was the first non-finite value" if self.phase == "loss" else f"{self.module}: first non-finite {what}"
        else:
            jump = f"{self.ratio:.3g}x" if self.ratio is not None and math.isfinite(self.ratio) else NA
            head = f"{self.module}: {what} norm jumped {jump} its median"
        shown = ", ".join(str(i) for i in self.sample_indices[:8]) + (" ..." if len(self.sample_indices) > 8 else "")
        where = f"step {self.bad_step}, rank {self.rank}, micro-batch {self.micro_batch}"
        return f"{head} ({where}; samples {shown or NA})"

    def reproduction(self) -> str:
        """Whether the replay gave the run's logged losses bit for bit, and what that points at."""
        if self.reproduced is None:
            return "losses: no logged loss of the replayed steps to compare"
        if self.reproduced:
            return (f"losses: reproduced bit for bit ({self.compared} logged steps): the data or the numerics "
                    "caused it, not the machine")
        d = self.difference or {}
        return (f"losses: NOT reproduced (step {d.get('step', NA)}: logged {d.get('original', NA)}, replay "
                f"{d.get('replay', NA)}): the step is not deterministic on this hardware, which points at the machine")


def read_report(path: Path) -> ReplayReport | None:
    """One report.json through the door (regular file, at most REPORT_BYTES); None if absent or not a report."""
    return ReplayReport.of(door.read_json(path, REPORT_BYTES))


@dataclass
class Causes:
    """The replays of one run by the step they replayed to, re-read only when a report.json changes."""

    run_dir: Path
    seen: dict[int, tuple[int, int, ReplayReport | None]] = field(default_factory=dict)  # step -> (mtime_ns, size, report)

    def poll(self) -> dict[int, str]:
        """{step: cause line} of every report under RUN/replay/."""
        out = {}
        for name in door.folder_names(replay_dir(self.run_dir), folders_only=True):
            step = int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else None
            if step is None:
                continue
            path = report_path(self.run_dir, step)
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            known = self.seen.get(step)
            if known is None or known[:2] != (st.st_mtime_ns, st.st_size):
                self.seen[step] = known = (st.st_mtime_ns, st.st_size, read_report(path))
            if known[2] is not None:
                out[step] = known[2].cause()
        return out
