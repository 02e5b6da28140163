"""`python -m tests.engine.readcount OUT -- ENGINE ARGS`: the engine, with every read of a tensor's value
that mt's own code makes (item, tolist, float, int, bool, cpu, numpy) counted and written to OUT.<rank>.

On a GPU each such read of a device tensor is a host-device sync; on the CPU they cost nothing, so
the count is what shows, on a CPU machine, how many syncs the loop would force on a GPU."""
from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import torch

ROOTS = tuple(str(Path(__file__).resolve().parents[2] / d) + os.sep for d in ("engine", "mt"))
# the dataset's own checks read the host's samples before they go to the device: never a sync
HOST_ONLY = (str(Path(__file__).resolve().parents[2] / "engine" / "data.py"),)
READS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")


def _counting(name: str, counts: dict[str, int]):
    original = getattr(torch.Tensor, name)

    def read(self, *args, **kwargs):
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(ROOTS) and caller not in HOST_ONLY:
            counts[f"{name} {caller.rsplit(os.sep, 1)[-1]}:{sys._getframe(1).f_lineno}"] = \
                counts.get(f"{name} {caller.rsplit(os.sep, 1)[-1]}:{sys._getframe(1).f_lineno}", 0) + 1
        return original(self, *args, **kwargs)
    return read


def main() -> int:
    out, args = sys.argv[1], sys.argv[3:]
    counts: dict[str, int] = {}
    for name in READS:
        setattr(torch.Tensor, name, _counting(name, counts))

    def write() -> None:
        lines = "".join(f"{n}\t{where}\n" for where, n in sorted(counts.items()))
        Path(f"{out}.{os.environ.get('RANK', '0')}").write_text(lines)
    atexit.register(write)
    from engine.__main__ import main as engine_main
    return engine_main(args)


if __name__ == "__main__":
    sys.exit(main())
