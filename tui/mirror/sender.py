"""Sending notifications through apprise, in a thread of their own: the supervisor only offers them.

A bounded queue between the two: a service that hangs fills it and what does not fit is dropped
(counted, said in the next notice), never waited for. Every failed send is a line of the supervisor's
log. apprise (the notify extra) is imported only here and in `check_urls`, at launch.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from mt.contract.config import ConfigError

QUEUE_SIZE = 16      # notices waiting for a slow service; more than a minute's cap (notify_per_minute)
CLOSE_WAIT_S = 10.0  # how long a supervisor that is done waits for its last notices to leave


@dataclass
class Notice:
    """One notification: `kind` (an incident code, rollback, end) for the rate limit and the log."""

    kind: str
    title: str
    body: str
    level: str = "info"          # apprise's NotifyType: info, success, warning, failure
    t: float = 0.0               # when what it tells of happened
    build: Callable[[], tuple[str, str]] | None = None   # (title, body) made in the sender's thread (reads files)
    held: str = ""               # a line on the notices the rate limit held back before this one

    def text(self) -> tuple[str, str]:
        """(title, body) as sent."""
        title, body = self.build() if self.build else (self.title, self.body)
        return title, "\n".join(p for p in (body, self.held) if p)


def _apprise() -> Any:
    import apprise

    return apprise


def instantiate(urls: list[str], source: str, key: str = "monitor.notify") -> list[Any]:
    """Each URL as an apprise service; ConfigError naming the one apprise cannot use (ImportError without apprise)."""
    apprise = _apprise()
    servers = []
    for i, url in enumerate(urls):
        server = apprise.Apprise.instantiate(url) if url.strip() else None
        if server is None:
            raise ConfigError(source, f"{key}[{i}]", f"{url!r} is not a URL apprise can send to "
                                                     "(e.g. ntfy://topic, slack://..., mailto://..., json://host/path)")
        servers.append(server)
    return servers


def shown(server: Any) -> str:
    """A service as the log names it: its URL with secrets masked and no options."""
    return str(server.url(privacy=True)).split("?", 1)[0]


class Sender:
    """A daemon thread sending each offered Notice to every service; `offer` never blocks."""

    def __init__(self, servers: list[Any], log: logging.Logger, size: int = QUEUE_SIZE) -> None:
        self.servers, self.log = servers, log
        self.queue: queue.Queue[Notice] = queue.Queue(size)
        self.closing = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, name="mt-notify", daemon=True)
        self.thread.start()

    def offer(self, notice: Notice) -> bool:
        """Queue it; False (dropped) when the queue is full: the services are slower than the run."""
        try:
            self.queue.put_nowait(notice)
            return True
        except queue.Full:
            self.log.warning("notification dropped (%s: %s): %d still waiting for a slow service",
                             notice.kind, notice.title, self.queue.qsize())
            return False

    def _run(self) -> None:
        while not (self.closing.is_set() and self.queue.empty()):
            try:
                notice = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self._send(notice)
            except Exception:   # a notifier must never end the supervisor: whatever broke, log it and go on
                self.log.exception("notification %s failed", notice.kind)

    def _send(self, notice: Notice) -> None:
        apprise = _apprise()
        title, body = notice.text()
        for server in self.servers:
            began = time.time()
            # apprise says why a send failed only in its log: catch it for the supervisor's
            with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as said:
                ok = server.notify(body=body, title=title, notify_type=notice.level)
            if ok:
                self.sent += 1
                now = time.time()
                self.log.info("notified %s of %s in %.2f s, %.2f s after it happened", shown(server), notice.kind,
                              now - began, now - notice.t if notice.t else float("nan"))
            else:
                why = " ".join(said.getvalue().split())[-400:] or "no reason given"
                self.log.warning("notification %s to %s failed after %.1f s: %s", notice.kind, shown(server),
                                 time.time() - began, why)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Send what is queued for up to `wait_s`, then leave it (the thread dies with the process)."""
        self.closing.set()
        self.thread.join(wait_s)
        if self.thread.is_alive():
            self.log.warning("%d notifications not sent: the service did not answer within %.0f s",
                             self.queue.qsize() + 1, wait_s)
