"""The best checkpoints a script reports (`run.checkpoint_saved(path, step, metrics=...)`), marked as
the engine marks its own (mt/contract/checkpoints.py `rank_best`): by one number, lower or higher
better, over every attempt's reports whose file or folder still exists."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mt.contract.checkpoints import rank_best, reported_events
from mt.values import as_number

MODES = ("min", "max")


@dataclass
class ScriptBest:
    """Rank 0's memory of the reported checkpoints' numbers: earlier attempts' read once from events.jsonl."""

    events: Path
    seen: dict[str, dict[int, tuple[float, str]]] = field(default_factory=dict)  # metric -> step -> (value, path)

    def fields(self, step: int, path: Path, metrics: Mapping[str, Any], metric: str, mode: str, keep: int) -> dict[str, Any]:
        """The checkpoint event's `metrics`, `best` ({step: value}, best first) and `best_metric`."""
        if mode not in MODES:
            raise ValueError(f"best_mode {mode!r}: one of {', '.join(MODES)}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise ValueError(f"keep_best {keep!r}: a whole number >= 0")
        values = {str(k): as_number(v, str(k)) for k, v in metrics.items()}
        if metric not in self.seen:   # newest first: a step reported twice (a resumed timeline) keeps its newest
            earlier: dict[int, tuple[float, str]] = {}
            for rec in reported_events(self.events):
                value = (rec.metrics or {}).get(metric)
                if value is not None and rec.step not in earlier:
                    earlier[rec.step] = (value, rec.path)
            self.seen[metric] = earlier
        seen = self.seen[metric]
        if metric in values:
            seen[step] = (values[metric], str(path))
        steps = rank_best([(s, v) for s, (v, p) in seen.items() if os.path.exists(p)], mode, keep)
        return {"metrics": values, "best": {str(s): seen[s][0] for s in steps}, "best_metric": metric}
