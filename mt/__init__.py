"""mt: the library a training script imports, and the contract every part of mt shares.

    import mt
    run = mt.init(config=vars(args))
    ctl = run.step(step, loss=loss.item(), lr=lr)     # every rank, every optimizer step

Stdlib only, and it never imports `engine` or `tui`: it runs inside a user's own process,
whose folder may hold modules of those names. docs/library.md.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Control", "Run", "init"]


def __getattr__(name: str) -> Any:
    # the library loads on first use: mt's own CLI, supervisor and engine import mt.* modules
    # for the contract and must not pay for it at start-up
    if name == "init":
        from mt.start import init
        return init
    if name in __all__:
        from mt import run
        return getattr(run, name)
    raise AttributeError(f"module 'mt' has no attribute {name!r}")
