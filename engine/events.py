"""The contract between engine and viewer: run-directory layout, event schema, JSONL I/O.

Stdlib only (the `tui` side imports it and must never load torch). See shared/DESIGN.md.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

SCHEMA_VERSION = 1

# kind -> fields every event of that kind carries (besides v, t, kind)
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "run_start": (
        "run_id", "attempt", "world_size", "nnodes", "device", "backend", "precision", "config",
        "params_total", "params_trainable", "tokens_per_step", "effective_batch",
        "static_mem_bytes", "start_step", "max_steps", "resumed_from", "torch_version",
        "git_commit",
    ),
    "step": (
        "step", "epoch", "loss", "lr", "grad_norm", "clipped", "tokens_per_s", "step_time_s",
        "data_wait_s", "samples_seen", "tokens_seen", "skipped", "mem_alloc_bytes",
        "mem_peak_bytes",
    ),
    "eval": ("step", "val_loss"),
    "checkpoint": ("step", "path", "bytes", "seconds", "reason", "request_id"),
    "incident": ("step", "code", "severity", "title", "detail", "advice", "evidence"),
    "control": ("request_id", "action", "status", "detail"),
    "run_end": ("step", "status", "reason"),
}

RUN_STATES = ("starting", "running", "stopping", "completed", "stopped", "failed", "killed")
FINAL_STATES = ("completed", "stopped", "failed", "killed")
INCIDENT_CODES = (
    "dataloader_stall", "nan_loss", "loss_spike", "grad_explosion", "fp16_overflow",
    "throughput_drop", "hang", "straggler", "memory_pressure", "oom", "nccl_timeout", "crash",
    "checkpoint_skipped",  # beyond DESIGN.md: a damaged checkpoint passed over on resume
    "disk_full",  # beyond DESIGN.md: a checkpoint that did not fit was skipped (or ended the run)
)
CONTROL_ACTIONS = ("checkpoint", "stop")


@dataclass(frozen=True)
class RunPaths:
    """Where everything lives inside one run directory."""

    root: Path

    @property
    def preset(self) -> Path:
        return self.root / "preset.toml"

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def system(self) -> Path:
        return self.root / "system.jsonl"

    @property
    def incidents(self) -> Path:
        return self.root / "incidents.jsonl"

    @property
    def heartbeat_dir(self) -> Path:
        return self.root / "heartbeat"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeat_dir / f"rank{rank}"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    @property
    def supervisor_log(self) -> Path:
        return self.logs / "supervisor.log"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def reserve(self) -> Path:
        """Space the supervisor holds so it can record the final state on a full disk."""
        return self.root / ".reserve"


def make_event(kind: str, **fields: Any) -> dict[str, Any]:
    """An event dict with the envelope filled in; raises on a missing field (a bug, not input)."""
    missing = [f for f in EVENT_FIELDS[kind] if f not in fields]
    if missing:
        raise ValueError(f"{kind} event lacks {missing}")
    return {"v": SCHEMA_VERSION, "t": time.time(), "kind": kind, **fields}


def schema_errors(event: Any) -> list[str]:
    """What is wrong with one parsed event line (empty when it matches the schema)."""
    if not isinstance(event, dict):
        return ["not a JSON object"]
    errors = []
    if event.get("v") != SCHEMA_VERSION:
        errors.append(f"v is {event.get('v')!r}")
    if not isinstance(event.get("t"), (int, float)):
        errors.append("t is not a number")
    kind = event.get("kind")
    if kind not in EVENT_FIELDS:
        errors.append(f"unknown kind {kind!r}")
        return errors
    errors += [f"{kind} lacks {f}" for f in EVENT_FIELDS[kind] if f not in event]
    return errors


def dumps(obj: Any) -> str:
    """One JSONL line. Non-finite floats become the strings "nan"/"inf" so every reader copes."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:  # rare: a NaN or inf somewhere
        return json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:
        return "nan"
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def as_float(value: Any) -> float:
    """A numeric event field as float, turning the "nan"/"inf" strings back into floats."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer beyond float range (a line from elsewhere)
            return float("inf") if value > 0 else float("-inf")
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return float("nan")
    return float("nan")


def write_json_atomic(path: Path, obj: Any, mode: int = 0o600) -> None:
    """Write JSON to a temporary file in the same folder, then rename it into place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dumps(obj))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any | None:
    """A small JSON file (status, heartbeat, control), or None if missing or unreadable."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


_CHECKPOINT_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder name (`step-<S>`), None for any other name."""
    m = _CHECKPOINT_DIR.match(name)
    return int(m.group(1)) if m else None


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One JSONL line as a dict; None when it is not a JSON object (torn, garbage, a list)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class JsonlTail:
    """Reads only the new complete lines of a growing JSONL file.

    Keeps a half-written last line back until it is finished, skips and counts lines that are
    not JSON objects, and starts over when the file is truncated or replaced.
    """

    def __init__(self, path: Path | str, offset: int = 0, ino: int | None = None) -> None:
        """Start at `offset` (a line boundary) of the file with inode `ino`, e.g. after a bulk read."""
        self.path = Path(path)
        self.offset = offset
        self.bad_lines = 0
        self.resets = 0
        self._partial = b""
        self._ino = ino

    @classmethod
    def near_end(cls, path: Path | str, max_bytes: int) -> "JsonlTail":
        """A tail that skips all but (about) the last max_bytes: for files where only recent lines matter."""
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                start = max(0, st.st_size - max_bytes)
                if start:
                    f.seek(start - 1)
                    start += len(f.readline()) - 1     # to the next line boundary
                return cls(path, start, st.st_ino)
        except OSError:
            return cls(path)

    def read_new(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        return list(self.iter_new(max_bytes))

    def iter_new(self, max_bytes: int | None = None) -> Iterator[dict[str, Any]]:
        """Yield each new complete, valid line as a dict (at most max_bytes read per call)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if self._ino is not None and (st.st_ino != self._ino or st.st_size < self.offset):
            self.offset, self._partial = 0, b""
            self.resets += 1
        self._ino = st.st_ino
        if st.st_size == self.offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(max_bytes) if max_bytes else f.read()
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            obj = parse_line(line)
            if obj is None:
                self.bad_lines += 1
            else:
                yield obj


def read_events(path: Path | str) -> list[dict[str, Any]]:
    """Every valid line of a JSONL file (the last line counts when it is complete JSON)."""
    tail = JsonlTail(path)
    events = tail.read_new()
    last = parse_line(tail._partial) if tail._partial.strip() else None
    if last is not None:
        events.append(last)
    return events


class EventWriter:
    """Appends events to events.jsonl, one whole line per write so readers never see a torn one,
    and a record per line to its binary index (`engine.eventindex`)."""

    def __init__(self, path: Path, index: bool = True) -> None:
        from engine.eventindex import open_index  # it builds on this module
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)  # RDWR: to look at the last byte
        _end_torn_line(self._fd)
        self._index = open_index(self.path) if index else None

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = make_event(kind, **fields)
        os.write(self._fd, (dumps(event) + "\n").encode())
        if self._index is not None:
            # with O_APPEND the offset now sits just past our line
            self._index.add(event, os.lseek(self._fd, 0, os.SEEK_CUR))
        return event

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._index is not None:
            self._index.close()


def _end_torn_line(fd: int) -> None:
    """A writer killed mid-line left a fragment: end it, so it stays one bad line of its own."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


class NullEventWriter:
    """What ranks other than 0 get: the same interface, doing nothing."""

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        return make_event(kind, **fields)

    def close(self) -> None:
        pass
