"""How mt's own messages write byte counts and numbers (a disk-full reason, an incident's text).

Stdlib only: mt cannot import the viewer's tui/format/fmt.py; the supervisor and `mt launch` use these
too, so each is written once.
"""
from __future__ import annotations

import math
from pathlib import Path

NA = "N/A"   # the one word for "not available", in mt's messages and in the viewer (tui/format/fmt.py)


BYTE_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "MB": 10**6}


def human_bytes(n: float | None, unit: str | None = None, suffix: bool = True) -> str:
    """The one byte formatter: 1536 -> '1.5 KiB' (the unit that fits), or in a fixed `unit` ('GiB'; 'MB' is
    decimal), one decimal; `suffix=False` for a column already labelled; None -> NA."""
    if n is None:
        return NA
    if unit is None:
        unit = next((u for u in ("B", "KiB", "MiB", "GiB") if abs(n) < 1024 * BYTE_UNITS[u]), "TiB")
    value = n / BYTE_UNITS[unit]
    text = format(value, ".0f" if unit == "B" else ".1f") if math.isfinite(value) else str(value)
    if len(text) > 16:   # a hostile file's 1e308 would be 300 digits wide
        text = format(value, ".4g")
    return f"{text} {unit}" if suffix else text


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

