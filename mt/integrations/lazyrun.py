"""What every adapter shares: the mt run it reports to, joined (or made) on first use, and its resume point."""
from __future__ import annotations

import mt


class LazyRun:
    """Mixed into an adapter's callback: `run` calls mt.init on first use, once the framework has set up its ranks."""

    def __init__(self, run: mt.Run | None = None) -> None:
        self._run = run

    @property
    def run(self) -> mt.Run:
        """The mt run, joined (or made) on first use: after the framework's ranks exist, so every rank agrees."""
        if self._run is None:
            self._run = mt.init()
        return self._run

    @property
    def resume_from(self) -> str | None:
        """The newest checkpoint an earlier attempt reported (a file or a folder), or None; after
        `mt rollback`, the one at or before its step. A Trainer cannot skip batches nor scale its
        scheduled lr from outside: a rollback asking for either is refused here, in one line."""
        run = self.run
        if run.rollback is not None and (run.skip_batches or run.lr_scale is not None):
            raise ValueError(f"mt rollback: {type(self).__name__} can go back to a checkpoint but cannot skip batches or "
                             f"scale the lr (asked: --skip-batches {run.skip_batches}, --lr-scale {run.lr_scale}); "
                             f"run mt rollback again with --skip-batches 0 and no --lr-scale (docs/library.md#rollback)")
        path = run.resume_from
        return str(path) if path is not None else None
