"""Plot history in compact arrays: a million points cost 16 MB per series, not a million dicts.

numpy is loaded with the first point, not with this module, so a dashboard can show its
header before any plot needs numpy. Smoothing and downsampling live in `tui.state.plotmath`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    import numpy as np


class Series:
    """One (x, y) curve, x ascending (optimizer step); `version` bumps on every change.

    Points live in numpy buffers that double when full, so a bulk load is one copy and a
    live append is amortised O(1). Until something needs the arrays, appended points wait in
    a list: a dashboard shows its header without waiting for numpy to load.
    """

    def __init__(self) -> None:
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None
        self._n = 0
        self._waiting: list[tuple[float, float]] = []
        self.version = 0
        self.generation = 0  # bumps when points are removed (caches must start over)

    def __len__(self) -> int:
        return self._n + len(self._waiting)

    def _flush(self) -> None:
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            self._reserve(len(waiting))
            for i, (x, y) in enumerate(waiting, start=self._n):
                self._x[i], self._y[i] = x, y
            self._n += len(waiting)

    def _reserve(self, extra: int) -> None:
        need = self._n + extra
        have = 0 if self._x is None else self._x.size
        if need > have:
            cap = max(need, 2 * have, 256)
            x, y = _np().empty(cap), _np().empty(cap)
            if self._n:
                x[: self._n], y[: self._n] = self._x[: self._n], self._y[: self._n]
            self._x, self._y = x, y

    def append(self, x: float, y: float) -> None:
        if self._x is None or self._waiting:
            self._waiting.append((x, y))
        else:
            self._reserve(1)
            self._x[self._n], self._y[self._n] = x, y
            self._n += 1
        self.version += 1

    def extend(self, xs: Iterable[float] | np.ndarray, ys: Iterable[float] | np.ndarray) -> None:
        """Append many points at once (bulk load from a scan)."""
        self._flush()
        np_ = _np()
        xs = np_.asarray(xs if isinstance(xs, np_.ndarray) else list(xs), dtype=np_.float64)
        ys = np_.asarray(ys if isinstance(ys, np_.ndarray) else list(ys), dtype=np_.float64)
        if xs.shape != ys.shape:
            raise ValueError("x and y of different lengths")
        self._reserve(xs.size)
        if xs.size:
            self._x[self._n:self._n + xs.size], self._y[self._n:self._n + ys.size] = xs, ys
        self._n += xs.size
        self.version += 1

    def truncate_after(self, x: float) -> None:
        """Drop points with x > `x`: a resumed attempt replaces what followed its checkpoint."""
        self._flush()
        if self._n and self._x[self._n - 1] > x:
            self._n = int(_np().searchsorted(self._x[: self._n], x, side="right"))
            self.version += 1
            self.generation += 1

    def clear(self) -> None:
        self._n = 0
        self._waiting = []
        self.version += 1
        self.generation += 1

    def replace(self, other: "Series") -> None:
        """Take another series' points, keeping this object (widgets hold references to it).

        The buffers are taken over, not copied: `other` must not be used afterwards.
        """
        other._flush()
        self._x, self._y, self._n, self._waiting = other._x, other._y, other._n, []
        self.version += 1
        self.generation += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Views of the points; later appends never change what a view shows (new points go
        past its end; a full buffer is replaced, not resized)."""
        self._flush()
        if self._x is None:
            empty = _np().empty(0)
            return empty, empty
        return self._x[: self._n], self._y[: self._n]

    def last(self) -> float | None:
        if self._waiting:
            return self._waiting[-1][1]
        return float(self._y[self._n - 1]) if self._n else None


def _np() -> Any:
    import numpy
    return numpy
