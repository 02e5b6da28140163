"""How mt's own messages write byte counts and numbers (a disk-full reason, an incident's text).

Stdlib only: mt cannot import the viewer's tui/format/fmt.py; the supervisor and `mt launch` use these
too, so each is written once.
"""
from __future__ import annotations

from pathlib import Path

NA = "N/A"   # the one word for "not available", in mt's messages and in the viewer (tui/format/fmt.py)


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB'; None -> NA."""
    if n is None:
        return NA
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def short_num(x: float | None) -> str:
    """A number in a sentence, three significant digits: 0.000312, 1.5e+04; NA when unknown."""
    return NA if x is None else f"{x:.3g}"


def failure_reason(rank: int, kind: type[BaseException], exc: BaseException) -> str:
    """A failed run's reason: `rank <r>: <Type>: <the message's first line>`."""
    first = (str(exc).splitlines() or [""])[0][:400]
    return f"rank {rank}: {kind.__name__}: {first}" if first else f"rank {rank}: {kind.__name__}"


def tree_size(path: Path) -> int | None:
    """Bytes of a checkpoint file, or of everything under a checkpoint folder."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else None
    except OSError:
        return None

