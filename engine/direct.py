"""`python -P -m engine.direct MODULE ARGS`: the one worker of a run started without torchrun.

For one process the supervisor skips torchrun (`tui/supervise/torchrun.py` `is_direct`), but the
worker still gets what torchrun gives a rank (`MASTER_ADDR`/`MASTER_PORT`, `LOCAL_RANK`, ...):
a script's own `init_process_group()` (env://, as the HF Trainer and accelerate call it too)
connects to a store whatever the process count. torchrun's agent hosts that store; here the
worker does, on the loopback socket its supervisor bound and handed down (`MT_STORE_FD`), then
runs MODULE (`engine` or `mt.script`) as `python -P -m MODULE ARGS` would.
"""
from __future__ import annotations

import os
import runpy
import socket
import sys

from engine.loopback import serve_store
from mt.contract.config import STORE_FD_ENV


def host_store():  # -> torch.distributed.TCPStore | None
    """Serve the store on the handed-down socket; None (and one line on stderr) when it cannot."""
    fd = os.environ.pop(STORE_FD_ENV, None)  # the worker's own children must not serve it again
    if fd is None:
        return None
    try:
        return serve_store(socket.socket(fileno=int(fd)))
    except (OSError, ValueError, RuntimeError) as e:  # init_process_group then says what is missing
        print(f"mt: cannot serve the process group's store on 127.0.0.1:{os.environ.get('MASTER_PORT')}: {e}",
              file=sys.stderr, flush=True)
        return None


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -P -m engine.direct MODULE ARGS")
    store = host_store()
    for name in [m for m in sys.modules if m == "engine" or m.startswith("engine.")]:
        del sys.modules[name]  # a script's own `import engine` must find its own engine.py, not us
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    del store  # referenced until the worker returns: the server stops with it


if __name__ == "__main__":
    main(sys.argv[1:])
