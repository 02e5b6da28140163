"""A real local HTTP receiver for apprise's `json://` notifications (http.server in a thread)."""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator


@dataclass
class Got:
    """One notification as it arrived: when, where to, and apprise's JSON payload."""

    t: float
    path: str
    payload: dict[str, Any]

    @property
    def title(self) -> str:
        return str(self.payload.get("title", ""))

    @property
    def message(self) -> str:
        return str(self.payload.get("message", ""))


@dataclass
class Receiver:
    """What arrived so far; `hang` True: every request is read, noted, then never answered until closed."""

    port: int = 0
    hang: bool = False
    got: list[Got] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str = "/mt") -> str:
        return f"json://127.0.0.1:{self.port}{path}"

    def received(self) -> list[Got]:
        with self.lock:
            return list(self.got)


@contextmanager
def receiver(hang: bool = False) -> Iterator[Receiver]:
    """A Receiver listening on a free port of 127.0.0.1 for the block's length."""
    rec = Receiver(hang=hang)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with rec.lock:
                rec.got.append(Got(time.time(), self.path, json.loads(body)))
            if rec.hang:
                rec.release.wait(120)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:   # no access log on the tests' stderr
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    rec.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        rec.release.set()
        server.shutdown()
        server.server_close()
