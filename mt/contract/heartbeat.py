"""heartbeat/rank<N>: each rank's last step, time and phase, rewritten in place every step."""
from __future__ import annotations

import json
import math
import mmap
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from mt.contract import door
from mt.contract.anatomy import PARTS, StepAnatomy
from mt.contract.events import JSON_ERRORS, as_float
from mt.contract.paths import RunPaths
from mt.contract.space import allocate


class Heartbeat:
    """Rewrites heartbeat/rank<N> each optimizer step, so a stuck rank is visible from outside.

    A fixed-width record in a memory-mapped file: a beat is a memory copy, no system call, so
    it costs about a microsecond in a training step (readers see it at once through the page
    cache, and the kernel keeps it if the process dies). Readers parse JSON and ignore the padding.
    `anatomy`, when set, adds the rank's step anatomy (mt/contract/anatomy.py) to each record;
    `gpu` (`gpu_fragment`), the rank's GPU and its allocator's memory at the last step.
    """

    WIDTH = 512   # the longest record: anatomy (~230 bytes with its six parts) and gpu (~190) fit

    def __init__(self, path: Path, rank: int, attempt: int) -> None:
        self.path, self.rank, self.attempt = path, rank, attempt
        self._tail = f',"pid":{os.getpid()},"rank":{int(rank)},"attempt":{int(attempt)},"phase":"'
        self._map = _mapped(path, self.WIDTH + 1)
        self.anatomy: StepAnatomy | None = None
        self.gpu = ""

    def beat(self, step: int, phase: str = "train") -> None:
        """`phase` says what the rank does next (train, eval, checkpoint), so a long pause is explained."""
        parts = self.anatomy.fragment() if self.anatomy is not None else ""
        record = f'{{"step":{int(step)},"t":{time.time()!r}{self._tail}{phase}"{parts}{self.gpu}}}'.ljust(self.WIDTH) + "\n"
        self._map[:] = record.encode()[: self.WIDTH + 1]


def _own_file(path: Path) -> int:
    """This rank's heartbeat file, opened to write through the door (a dropped heartbeat/rank0 -> ~/.bashrc
    is never truncated, a FIFO never written); such a thing in its place is removed, not followed."""
    try:
        return door.open_own(path, os.O_RDWR)
    except door.Refused:
        os.unlink(path)   # the link or FIFO itself, never what it points to
        return door.open_own(path, os.O_RDWR | os.O_EXCL)


def _mapped(path: Path, size: int) -> mmap.mmap:
    """The file's first `size` bytes, mapped, with blocks behind them: a page of a sparse file on a
    full filesystem (a tmpfs) cannot be allocated when first written, and that write is a SIGBUS."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _own_file(path)
    try:
        os.ftruncate(fd, size)
        allocate(fd, size)  # no room: OSError here, not a signal in the training loop
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class BackgroundHeartbeat(Heartbeat):
    """A heartbeat whose writes happen in a daemon thread: a step only notes its number.

    For scripts, where every microsecond of a step is the user's: `note` is one attribute
    store; the thread writes the record within `every_s` of a change, and keeps doing so while
    the training thread is blocked in a collective (which releases the GIL), so a stuck rank's
    heartbeat still shows the step it is stuck after. Every 0.1 s: liveness is judged in seconds,
    and each wake takes the GIL from the training thread (at 50 a second it cost the loop more).
    """

    def __init__(self, path: Path | None, rank: int, attempt: int, every_s: float = 0.1,
                 on_tick: Callable[[], None] | None = None, tick_s: float = 0.5) -> None:
        """`path` None, or a file that cannot be made (`error` says why): no heartbeat, the ticks still run."""
        self.error: OSError | None = None
        self.path, self.rank, self.attempt, self._map = path, rank, attempt, None  # type: ignore[assignment]
        self.anatomy, self.gpu = None, ""
        if path is not None:
            try:
                super().__init__(path, rank, attempt)
            except OSError as e:
                self.error = e
        self._noted: tuple[int, str] = (0, "start")
        self._every_s = every_s
        self._thread: threading.Thread | None = None
        self._on_tick, self._tick_s = on_tick, tick_s

    def beat(self, step: int, phase: str = "train") -> None:
        if self._map is not None:
            super().beat(step, phase)

    def note(self, step: int, phase: str = "train") -> None:
        self._noted = (step, phase)
        if self._thread is None:
            self._thread = threading.Thread(target=self._pump, name="mt-heartbeat", daemon=True)
            self._thread.start()

    def _pump(self) -> None:
        """Beat on every change; every tick_s call on_tick (rank 0 writes the batched steps there,
        off the training thread, and still writes them while that thread is blocked or hung)."""
        written, due, said = None, time.monotonic() + self._tick_s, ""
        while True:
            noted = self._noted
            if noted != written:
                self.beat(*noted)
                written = noted
            if self._on_tick is not None and time.monotonic() >= due:
                due = time.monotonic() + self._tick_s
                try:
                    self._on_tick()
                except Exception as e:  # noqa: BLE001 - the training thread's own writes will say more
                    if f"{type(e).__name__}: {e}" != said:  # once, not every tick
                        said = f"{type(e).__name__}: {e}"
                        print(f"mt: background flush failed: {said}", file=sys.stderr)
            time.sleep(self._every_s)


STEP_LIMIT = 2**53   # a heartbeat past this step is absurd (285 years at a million steps a second), never progress


def read_heartbeats(paths: RunPaths, ranks: range | None = None,
                    max_step: int | None = None) -> dict[int, dict[str, Any]]:
    """heartbeat/rank<N> files of `paths`' node that parse as heartbeats, by rank; any other
    entry (a folder, a link, a FIFO that would block a read) is skipped alone. Bounded by what the
    run can hold: `ranks` (its world) are the only files read, a step past `max_step` (or STEP_LIMIT) is skipped."""
    out: dict[int, dict[str, Any]] = {}
    limit = STEP_LIMIT if max_step is None else min(max_step, STEP_LIMIT)
    try:
        with os.scandir(paths.heartbeat_dir) as it:
            found = [(int(e.name[4:]), e.path) for e in it if e.name.startswith("rank") and e.name[4:].isdigit()
                     and (ranks is None or int(e.name[4:]) in ranks) and e.is_file(follow_symlinks=False)]
    except OSError:
        return out
    for rank, path in found:
        hb = clean_heartbeat(_read_record(path))
        if hb is not None and hb["step"] <= limit:
            out[rank] = hb
    return out


def _read_record(path: str) -> Any:
    """One heartbeat file's JSON, or None: through the door (never blocks on a FIFO put there, never
    follows a link), no buffered file object (a job's viewer reads a thousand of these a second)."""
    try:
        data = door.read_bytes(path, _READ_MAX)
    except OSError:
        return None
    try:
        return json.loads(data)
    except JSON_ERRORS:   # a torn or foreign file; a bad UTF-8 byte is a ValueError too
        return None


_READ_MAX = 4096   # a record is 513 bytes; a longer file is not a heartbeat (and fails to parse)
_GPU_KEYS = ("alloc", "reserved", "peak", "total")
_UUID_CHARS = frozenset("0123456789abcdefABCDEF-GPUMI/")   # GPU-<hex>, MIG-<hex> or CUDA's bare <hex> form


def gpu_fragment(uuid: str | None, alloc: int, reserved: int, peak: int, total: int) -> str:
    """A heartbeat's `gpu` field: the rank's GPU (CUDA's UUID) and its caching allocator's bytes, `peak`
    since the previous step (torch.cuda.reset_peak_memory_stats each step), `total` the GPU's memory."""
    who = f'"uuid":"{uuid}",' if uuid and len(uuid) <= 64 and set(uuid) <= _UUID_CHARS else ""
    return f',"gpu":{{{who}"alloc":{int(alloc)},"reserved":{int(reserved)},"peak":{int(peak)},"total":{int(total)}}}'


def clean_gpu(raw: Any) -> dict[str, Any] | None:
    """A heartbeat's `gpu` field with its types checked (uuid a short string, byte counts whole and >= 0), or None."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {k: raw[k] for k in _GPU_KEYS if type(raw.get(k)) is int and 0 <= raw[k] < 2**63}
    if len(out) < len(_GPU_KEYS):
        return None
    uuid = raw.get("uuid")
    out["uuid"] = uuid if isinstance(uuid, str) and 0 < len(uuid) <= 64 and set(uuid) <= _UUID_CHARS else None
    return out


def clean_heartbeat(raw: Any) -> dict[str, Any] | None:
    """A heartbeat record with the types the rules rely on (a whole step and a finite time), or None."""
    if not isinstance(raw, dict):
        return None
    step, t = as_float(raw.get("step")), as_float(raw.get("t"))
    if not (0 <= step < 2.0 ** 63 and math.isfinite(t)):   # nan fails too; int(inf) would raise
        return None
    ints = {k: raw[k] for k in ("pid", "rank", "attempt") if raw.get(k) is not None}
    if any(isinstance(v, bool) or not isinstance(v, int) for v in ints.values()):
        return None
    phase = raw.get("phase")
    anatomy, gpu = clean_anatomy(raw.get("anatomy")), clean_gpu(raw.get("gpu"))
    return {"step": int(step), "t": t, **ints, **({"phase": phase} if isinstance(phase, str) else {}),
            **({"anatomy": anatomy} if anatomy else {}), **({"gpu": gpu} if gpu else {})}


def clean_anatomy(raw: Any) -> dict[str, float]:
    """A heartbeat's step anatomy: its known parts that are finite, non-negative seconds (and n)."""
    if not isinstance(raw, dict):
        return {}
    out = {k: float(raw[k]) for k in ("n", *PARTS) if type(raw.get(k)) in (int, float) and 0 <= raw[k] < math.inf}
    return out if "n" in out and "step_s" in out else {}
