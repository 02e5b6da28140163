"""mt: the library a training script imports, and the contract every part of mt shares.

    import mt
    run = mt.init(config=vars(args))
    ctl = run.step(step, loss=loss.item(), lr=lr)     # every rank, every optimizer step

Stdlib only, and it never imports `engine` or `tui`: it runs inside a user's own process,
whose folder may hold modules of those names. docs/library.md.
"""
from mt.run import Control, Run, init

__all__ = ["Control", "Run", "init"]
