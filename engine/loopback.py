"""`python -P -m engine.loopback TORCHRUN-ARGS`: torchrun for one node, its stores on loopback only.

torchrun's c10d rendezvous store and the agent store it shares with the workers both bind every
interface (`::`) whatever host they are given (torch 2.x TCPStore). This registers a rendezvous
backend, `mt-loopback`, whose two stores listen on a socket we bind to 127.0.0.1 ourselves (the
documented `rendezvous_handler_registry` extension point), then runs torchrun's own main.
"""
from __future__ import annotations

import gc
import socket
import sys
from datetime import timedelta

BACKEND = "mt-loopback"
LOOPBACK = "127.0.0.1"


def loopback_store(port: int = 0, timeout_s: float = 60.0):  # -> torch.distributed.TCPStore
    """A TCPStore server that listens on 127.0.0.1:port only (0: a free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, port))
        sock.listen(256)
        return serve_store(sock, timeout_s)
    finally:
        sock.close()  # a no-op once detached; closes the socket if the store could not start


def serve_store(sock: socket.socket, timeout_s: float = 60.0):  # -> torch.distributed.TCPStore
    """A TCPStore server on `sock`, a listening socket bound to 127.0.0.1 (it takes the socket over)."""
    import torch.distributed as dist

    port = sock.getsockname()[1]
    # the store serves on the socket we bound (master_listen_fd) instead of binding `::` itself
    return dist.TCPStore(LOOPBACK, port, is_master=True, master_listen_fd=sock.detach(),
                         use_libuv=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def _handler(params):  # RendezvousParameters -> RendezvousHandler
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    class LoopbackHandler(DynamicRendezvousHandler):
        def _create_tcp_store_server(self, master_addr, master_port):  # the workers' (agent) store
            return loopback_store(master_port)

    class LoopbackBackend(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # torchrun checks that the backend answers to the name it asked for
            return BACKEND

    store = loopback_store(0, float(params.get_as_int("read_timeout", 60) or 60))
    backend = LoopbackBackend(store, params.run_id)
    return LoopbackHandler.from_backend(params.run_id, store, backend, params.min_nodes,
                                        params.max_nodes, params.local_addr)


def main(argv: list[str]) -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.run import main as torchrun_main

    rendezvous_handler_registry.register(BACKEND, _handler)
    torchrun_main(argv)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    finally:
        gc.freeze()  # the agent imported torch too: no last full collection at exit (engine.exit_now)
