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
        """The newest checkpoint an earlier attempt reported (a file or a folder), or None."""
        path = self.run.resume_from
        return str(path) if path is not None else None
