"""The supervisor's captures for its incidents: when a `hang` or `dataloader_stall` opens, every
rank's stacks in a background thread (one at a time, one per opened incident), then the
verdict as an `update` of the same incident (docs/run-directory.md, incidents.jsonl).

On a node of a job's shared run directory the same thread answers every node's requests
(control/.stacks/, tui/stacks/nodes.py), and an incident's capture asks the other nodes too:
its verdict groups the ranks of every node that answered within the wait."""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mt.contract.paths import RunPaths
from tui.stacks.capture import PY_SPY_HINT, Capture, capture
from tui.stacks.nodes import NodesVerdict, gather, nodes_record, pending_requests, request_stacks
from tui.stacks.recorder import FlightReport, FlightWatch, analyze
from tui.stacks.verdict import kind_of

CAPTURE_CODES = ("hang", "dataloader_stall")
ODD_FRAMES = 6  # the odd rank's innermost user frames kept in the incident: what fits a panel at 80x24


@dataclass(frozen=True)
class Done:
    """A finished capture for an incident: its result, or why there is none."""

    code: str
    capture: Capture | None
    error: str = ""
    nodes: NodesVerdict | None = None   # a job's shared run directory: the verdict over every node
    flight: FlightReport | None = None  # code "flight": mt's reading of this node's flight-recorder dumps


def evidence_of(cap: Capture, run_dir: Path, nodes: NodesVerdict | None = None) -> dict[str, Any]:
    """What the incident gains: the folder (relative to the run), the verdict line, ranks per place
    (with `nodes`: the verdict over every node that answered, and the nodes that did not)."""
    if nodes is not None:
        cap = dataclasses.replace(cap, verdict=nodes.verdict)
    ev: dict[str, Any] = {
        "stacks": os.path.relpath(cap.folder, run_dir), "verdict": cap.verdict.line,
        "groups": [{"ranks": list(g.ranks), "func": g.place.frame.func, "where": g.place.frame.where(),
                    "waits_in": g.place.waits_in} for g in cap.verdict.groups],
        "capture_s": round(cap.seconds, 3),
    }
    frames = odd_frames(cap)
    if frames:
        ev["frames"] = frames
    if cap.workers:
        ev["workers"] = [w.line() for w in cap.workers]
    lacking = {str(st.rank): st.note for st in cap.stacks if st.rank in cap.verdict.missing}
    if lacking:  # why those ranks have no stack: e.g. what py-spy would add
        ev["no_stack"] = lacking
    if nodes is not None:
        kept = nodes_record(nodes)
        ev["groups"], ev["silent_nodes"] = kept["groups"], kept["silent_nodes"]
        ev["node_stacks"] = {n: os.path.relpath(p, run_dir) for n, p in nodes.folders.items()}
    return ev


def odd_frames(cap: Capture) -> list[str]:
    """The odd group's first rank: its main thread's innermost user frames (else its innermost ones), `func (file:line)`."""
    if not cap.verdict.groups:
        return []
    rank = cap.verdict.groups[0].ranks[0]
    main = next((s.main_thread() for s in cap.stacks if s.rank == rank), None)
    if main is None:
        return []
    own = [f for f in main.frames if kind_of(f.file) == "user"] or list(main.frames)
    return [f"rank {rank}: {f.func} ({f.where()})" if i == 0 else f"{f.func} ({f.where()})"
            for i, f in enumerate(own[:ODD_FRAMES])]


def detail_of(cap: Capture, nodes: NodesVerdict | None = None) -> str:
    """The sentence added to the incident's detail: the verdict, then the workers' places."""
    line = nodes.verdict.line if nodes is not None else cap.verdict.line
    silent = f"no capture from node {', '.join(nodes.silent)}" if nodes is not None and nodes.silent else ""
    spy = [st.rank for st in cap.stacks if st.rank in cap.verdict.missing and PY_SPY_HINT in st.note]
    lack = f"{'rank' if len(spy) == 1 else 'ranks'} {', '.join(map(str, spy))}: {PY_SPY_HINT}" if spy else ""
    return "; ".join([f"stacks: {line}", *(w.line() for w in cap.workers), *(x for x in (lack, silent) if x)])


def flight_evidence(report: FlightReport, run_dir: Path) -> dict[str, Any]:
    """What an incident gains from the flight recorder: the dumps' folder, each collective not every rank joined."""
    ev: dict[str, Any] = {"flight": os.path.relpath(report.folder, run_dir), "flight_line": report.line()}
    if report.error:
        ev["flight_error"] = report.error
    ev["unjoined"] = [{"seq": u.seq, "op": u.op, "group": u.group, "missing_ranks": list(u.missing),
                       "expected_ranks": list(u.expected), "state": u.state} for u in report.unjoined]
    return ev


class IncidentCaptures:
    """Starts captures off the supervisor's thread and hands back the finished ones (`take`)."""

    def __init__(self, run_dir: Path, log: logging.Logger, wait_s: float = 2.0, node: str | None = None,
                 nodes_wait_s: float = 10.0, flight: bool = False) -> None:
        """`flight`: mt turned the flight recorder on for this run (tui/stacks/recorder.py `dumps_here`);
        only then is flight/ watched: anything found there otherwise is no dump of torch's."""
        self.run_dir, self.log, self.wait_s = Path(run_dir), log, wait_s
        self.node, self.nodes_wait_s = node, nodes_wait_s
        self.since = time.time()   # requests older than this supervisor were for another one
        self._queue: list[str] = []
        self._answering: set[str] = set()   # request ids taken (answered or failed: never twice)
        self._done: list[Done] = []
        self._flights: list[Done] = []
        self._lock = threading.Lock()   # _done is filled by the capture thread, emptied by the tick
        self._thread: threading.Thread | None = None
        self.flight = FlightWatch(RunPaths(self.run_dir, node).flight) if flight else None

    def opened(self, code: str) -> None:
        """An incident opened: capture for it (now, or after the capture that runs)."""
        if code in CAPTURE_CODES:
            self._queue.append(code)
            self._next()

    def _next(self) -> None:
        if self.node is not None and (self._thread is None or not self._thread.is_alive()):
            for req in pending_requests(RunPaths(self.run_dir, self.node), self.since, frozenset(self._answering)):
                if req.id not in self._answering:
                    self._answering.add(req.id)
                    self._queue.append(f"request:{req.id}:{int(req.workers)}")
        if self.flight is not None and self.flight.ready(time.monotonic()):
            self._queue.append("flight")
        if self._queue and (self._thread is None or not self._thread.is_alive()):
            code = self._queue.pop(0)
            self._thread = threading.Thread(target=self._run, args=(code,), name=f"mt-stacks-{code}", daemon=True)
            self._thread.start()

    def _run(self, code: str) -> None:
        if code == "flight" and self.flight is not None:
            try:
                report = analyze(self.flight.dir)
            except Exception as e:  # never the end of the run
                self.log.exception("flight recorder analysis failed")
                report = FlightReport(self.flight.dir, (), str(e))
            if report.error:
                self.log.warning("flight recorder: %s", report.error)
            with self._lock:
                self._flights.append(Done(code, None, flight=report))
            return
        if code.startswith("request:"):  # another node's (or a viewer's) request: the capture is the answer
            _, rid, workers = code.split(":")
            try:
                capture(self.run_dir, "request", self.wait_s, workers == "1", self.node, rid)
            except Exception:
                self.log.exception("stacks capture for request %s failed", rid)
            return
        try:
            if self.node is None:
                done = Done(code, capture(self.run_dir, why=code, wait_s=self.wait_s,
                                          workers=code == "dataloader_stall"))
            else:  # ask every node, answer for this one, then group what came back
                rid = request_stacks(self.run_dir, workers=code == "dataloader_stall")
                self._answering.add(rid)
                cap = capture(self.run_dir, code, self.wait_s, code == "dataloader_stall", self.node, rid)
                done = Done(code, cap, nodes=gather(self.run_dir, rid, self.nodes_wait_s))
        except Exception as e:  # never the end of the run: the incident just goes without stacks
            self.log.exception("stacks capture for %s failed", code)
            done = Done(code, None, str(e))
        with self._lock:
            self._done.append(done)

    def take_flight(self) -> list[Done]:
        """The flight-recorder analyses finished since the last call."""
        with self._lock:
            done, self._flights = self._flights, []
        return done

    def take(self) -> list[Done]:
        """The captures finished since the last call; starts a queued one."""
        with self._lock:
            done, self._done = self._done, []
        self._next()
        return done
