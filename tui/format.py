"""Every number, byte count and duration the viewer prints, and one meaning of "not available"."""
from __future__ import annotations

import math


def fmt_num(v: float | None, spec: str = ".4g") -> str:
    if v is None:
        return "N/A"
    if not math.isfinite(v):
        return str(v)
    return format(v, spec)


def fmt_duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "N/A"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
