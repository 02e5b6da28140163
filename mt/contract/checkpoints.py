"""Checkpoint folders: their names, the one listing, the manifest, the one verification, the newest.

Stdlib only: the engine's pick, its room planning, `mt resume`, the supervisor and the viewers
all read checkpoint folders and manifest.json through here. Two layouts: "full" (model.pt,
optim.pt, train.pt) and "sharded" (train.pt beside the files of torch.distributed.checkpoint:
`.metadata` and one `__<rank>_0.distcp` per writing rank).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

from mt.contract import door
from mt.contract.events import JSON_ERRORS

FORMAT = "mt-checkpoint"
FORMAT_VERSION = 1
FILES = ("model.pt", "optim.pt", "train.pt")
SHARDED_FILES = ("train.pt", ".metadata")  # and every shard file the manifest lists
LAYOUTS = {"full": FILES, "sharded": SHARDED_FILES}
# one entry per file, one shard file per writing rank: far below this even on thousands of ranks
MAX_MANIFEST_BYTES = 16 << 20
_BLOCK = 1 << 20
_FOLDER = re.compile(r"^step-(\d+)$")

Verified = Literal["sizes", "sha256"]
"""How much a reader checks: "sizes" (the manifest and each file's size: listings, cheap) or
"sha256" (also every byte: what the engine continues from)."""


class CheckpointError(ValueError):
    """A checkpoint folder that is not a complete, intact checkpoint of this format."""


def _open_regular(path: Path, what: str) -> tuple[int, int]:
    """(fd, size) of a regular file opened through the door (a FIFO, a device, a folder or a
    link is refused before anything is read); FileNotFoundError passes."""
    try:
        fd, st = door.open_fd(path)
    except FileNotFoundError:
        raise
    except OSError as e:    # the door says "<path>: a FIFO, not a regular file"
        kind = str(e).removeprefix(f"{path}: ").split(",")[0]
        raise CheckpointError(f"{what}: not a regular file of the checkpoint ({kind})") from None
    return fd, st.st_size


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest's structure checked: format, version, layout, and {name: {sha256, bytes}} files."""
    try:
        fd, size = _open_regular(path / "manifest.json", f"{path}/manifest.json")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no manifest.json (incomplete or not an mt checkpoint)") from None
    try:
        if size > MAX_MANIFEST_BYTES:
            raise CheckpointError(f"{path}: unreadable manifest.json: {size} bytes (more than any manifest)")
        manifest = json.loads(os.read(fd, MAX_MANIFEST_BYTES + 1).decode("utf-8"))
    except CheckpointError:
        raise
    except (OSError, *JSON_ERRORS) as e:  # RecursionError: nesting too deep for the parser
        raise CheckpointError(f"{path}: unreadable manifest.json: {type(e).__name__}: {e}") from None
    finally:
        os.close(fd)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: manifest.json is not an {FORMAT} manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {_short(manifest.get('version'))}, expected {FORMAT_VERSION}")
    layout = manifest.get("layout", "full")  # manifests before sharded checkpoints have none
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise CheckpointError(f"{path}: unknown checkpoint layout {_short(layout)} (expected full or sharded)")
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise CheckpointError(f"{path}: manifest lists no files")
    for name in LAYOUTS[layout]:
        if name not in listed:
            raise CheckpointError(f"{path}: manifest lists no {name}")
    # full: its three files (older manifests may list more); sharded: every file DCP wrote
    files = {n: listed[n] for n in FILES} if layout == "full" else listed
    for name, want in files.items():
        if "/" in name or "\0" in name or name in ("", ".", "..", "manifest.json"):
            raise CheckpointError(f"{path}: manifest lists {_short(name)}, not a file of this folder")
        size, sha = (want.get("bytes"), want.get("sha256")) if isinstance(want, dict) else (None, None)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(sha, str):
            raise CheckpointError(f"{path}: manifest's entry for {_short(name)} is not {{sha256, bytes}}")
    return {**manifest, "layout": layout, "files": files}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def verify(path: Path, hashes: bool = True) -> dict[str, Any]:
    """The manifest of an intact checkpoint (its `layout` filled in); raises CheckpointError saying
    what is wrong. `hashes=False`: sizes only, no file read (listings)."""
    path = Path(path)
    try:
        manifest = read_manifest(path)
        listed = manifest["files"]
        if manifest["layout"] == "sharded":  # every file DCP wrote is listed, and nothing else lies beside them
            unlisted = sorted({p.name for p in path.iterdir()} - set(listed) - {"manifest.json"})
            if unlisted:
                raise CheckpointError(f"{path}/{unlisted[0]}: not in the manifest (an extra file in a sharded checkpoint)")
        for name, want in listed.items():
            _check_file(path, name, want["bytes"], want["sha256"] if hashes else None)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a damaged folder raises, it is not intact
        raise CheckpointError(f"{path}: cannot verify: {type(e).__name__}: {e}") from None
    return manifest


def _check_file(folder: Path, name: str, size: int, sha256: str | None) -> None:
    """The listed size, then (sha256 given) the hash of exactly that many bytes."""
    try:
        fd, actual = _open_regular(folder / name, f"{folder}/{name}")
    except FileNotFoundError:
        raise CheckpointError(f"{folder}/{name}: missing") from None
    try:
        if actual != size:
            raise CheckpointError(f"{folder}/{name}: {actual} bytes, manifest says {size} (truncated?)")
        if sha256 is None:
            return
        sha, left = hashlib.sha256(), size
        while left > 0:  # never more than the listed size: a file that grows is not read forever
            block = os.read(fd, min(_BLOCK, left))
            if not block:
                break
            sha.update(block)
            left -= len(block)
        if left or sha.hexdigest() != sha256:
            raise CheckpointError(f"{folder}/{name}: sha256 mismatch (corrupted)")
    finally:
        os.close(fd)


def intact(path: Path, hashes: bool = True) -> bool:
    """Whether `verify` passes (the room planning's and the listing's question)."""
    try:
        verify(path, hashes)
        return True
    except CheckpointError:
        return False


def listed_bytes(path: Path) -> int | None:
    """The bytes of a checkpoint whose files have the sizes its manifest lists (None otherwise)."""
    try:
        return sum(f["bytes"] for f in verify(path, hashes=False)["files"].values())
    except CheckpointError:
        return None


def folder_name(step: int) -> str:
    """The name of checkpoint `step`'s folder."""
    return f"step-{step}"


def step_of(name: str) -> int | None:
    """The step of a checkpoint folder name (`step-<S>`), None for any other name."""
    m = _FOLDER.match(name)
    return int(m.group(1)) if m else None


def folders(root: Path, verified: Verified | None = None) -> list[tuple[int, Path]]:
    """(step, folder) of every `step-<S>` folder under root, newest first: the one listing.

    Real folders only: a symlink (it could point at another run's checkpoint) or a misnamed
    folder is never a checkpoint. `verified`: only the folders that pass `verify` at that level.
    """
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    found = []
    for entry in entries:
        step = step_of(entry.name)
        try:
            if step is not None and entry.is_dir(follow_symlinks=False):
                found.append((step, Path(entry.path)))
        except OSError:
            continue
    found.sort(reverse=True)
    return found if verified is None else [(s, p) for s, p in found if intact(p, verified == "sha256")]


@dataclass(frozen=True)
class Damaged:
    """A checkpoint folder passed over, and `CheckpointError`'s message (naming the folder)."""

    path: Path
    message: str

    @property
    def why(self) -> str:
        """The message without the folder's own path (for a line that names the folder already)."""
        return self.message.replace(f"{self.path}/", "").replace(f"{self.path}: ", "")


@dataclass(frozen=True)
class Newest:
    """The newest checkpoint that verifies (None: none does), its manifest, and each newer one that did not."""

    path: Path | None
    manifest: dict[str, Any] = field(default_factory=dict)
    damaged: list[Damaged] = field(default_factory=list)

    @property
    def step(self) -> int | None:
        return step_of(self.path.name) if self.path else None

    def why_none(self) -> str:
        """Why there is none, in one line naming the first three folders passed over and why."""
        if not self.damaged:
            return "no checkpoint to resume from (checkpoints/ is empty)"
        shown = "; ".join(f"{d.path.name}: {d.why}" for d in self.damaged[:3]) + ("; ..." if len(self.damaged) > 3 else "")
        return f"no checkpoint is intact ({len(self.damaged)} checked: {shown})"


def newest(root: Path, verified: Verified = "sha256", check: Callable[[Path, dict[str, Any]], None] | None = None,
           at_most: int | None = None) -> Newest:
    """The newest checkpoint under root that passes `verify` at that level (and `check`, which may
    raise CheckpointError: the engine's load), newest step first; `at_most`: of a step at or before it."""
    damaged = []
    for step, path in folders(root):
        if at_most is not None and step > at_most:
            continue
        try:
            manifest = verify(path, hashes=verified == "sha256")
            if check is not None:
                check(path, manifest)
            return Newest(path, manifest, damaged)
        except CheckpointError as e:
            damaged.append(Damaged(path, str(e)))
    return Newest(None, {}, damaged)


@dataclass(frozen=True)
class Best:
    """A checkpoint among the best kept: its step, folder, and its number of `metric`."""

    step: int
    path: Path
    metric: str
    value: float


def best_field(metric: str, mode: str, value: float | None, keep: int) -> dict[str, Any]:
    """The manifest's `best` (docs/checkpoints.md): the checkpoint's number of `metric` (the eval at
    its own step; None: no candidate), whether lower or higher is better, and how many the run keeps."""
    return {"metric": metric, "mode": mode, "value": value, "keep": keep}


def rank_best(scored: list[tuple[int, float]], mode: str, keep: int) -> list[int]:
    """The steps of the best `keep` of (step, value), best first; on a tie the earlier step (best first)."""
    sign = -1.0 if mode == "max" else 1.0
    finite = [(s, v) for s, v in scored if v == v and abs(v) != float("inf")]
    return [s for s, _ in sorted(finite, key=lambda sv: (sign * sv[1], sv[0]))[:max(0, keep)]]


def best(root: Path) -> list[Best]:
    """The best checkpoints under root, best first, from their manifests alone (sizes verified): the
    newest manifest says the metric, the mode and how many (none without a `best` field: keep_best is
    0 now), so a restart or a resume derives the same marking; retention never deletes them."""
    rule: tuple[str, str, int] | None = None
    scored: dict[int, tuple[Path, float]] = {}
    for step, path in folders(root):
        try:
            field_ = verify(path, hashes=False).get("best")
        except CheckpointError:
            continue
        metric, mode, value, keep = (field_.get(k) for k in ("metric", "mode", "value", "keep")) if isinstance(field_, dict) else (None,) * 4
        ruled = isinstance(metric, str) and mode in ("min", "max") and isinstance(keep, int) and not isinstance(keep, bool)
        if rule is None:
            if not ruled:
                return []
            rule = (metric, mode, keep)
        if ruled and (metric, mode) == rule[:2] and isinstance(value, (int, float)) and not isinstance(value, bool):
            scored[step] = (path, float(value))
    if rule is None:
        return []
    return [Best(s, scored[s][0], rule[0], scored[s][1]) for s in rank_best([(s, v) for s, (_, v) in scored.items()], rule[1], rule[2])]


def reported(events: Path, chunk: int = 1 << 20) -> Path | None:
    """The newest checkpoint a `checkpoint` event names that still exists (a script's own format,
    or an engine folder): events.jsonl read backwards, so a long run costs only its tail."""
    return next((Path(rec.path) for rec in reported_events(events, chunk) if rec.path and os.path.exists(rec.path)), None)


def reported_at(events: Path, at_most: int | None, chunk: int = 1 << 20) -> tuple[Path, int] | None:
    """(path, step) of the newest reported checkpoint that still exists, of a step at or before
    `at_most` (None: any); newest in file order, so a rollback's new timeline wins over the old one."""
    return next(((Path(rec.path), rec.step) for rec in reported_events(events, chunk)
                 if rec.path and os.path.exists(rec.path) and (at_most is None or rec.step <= at_most)), None)


def reported_events(events: Path, chunk: int = 1 << 20) -> Iterator[Any]:
    """Every `checkpoint` event of events.jsonl as a typed record, newest first (read backwards in chunks)."""
    from mt.contract.records import Checkpoint, parse_event  # the typed parser: only for a script's run

    try:
        with door.open_file(events) as f:
            end = f.seek(0, 2)
            tail = b""
            while end > 0:
                start = max(0, end - chunk)
                f.seek(start)
                data = f.read(end - start) + tail
                end = start
                lines = data.split(b"\n")
                tail = lines.pop(0) if start > 0 else b""  # may be the end of a line that starts before
                for line in reversed(lines):
                    if b'"checkpoint"' not in line:
                        continue
                    rec = parse_event(line)
                    if isinstance(rec, Checkpoint):
                        yield rec
    except OSError:     # missing, or refused by the door (a FIFO, a device, a link)
        return
