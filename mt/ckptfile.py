"""What makes a checkpoint folder intact: its manifest's format, and each file's size and sha256.

Stdlib only: the engine checks before it loads, `mt resume` before it starts anything. Two
layouts: "full" (model.pt, optim.pt, train.pt) and "sharded" (train.pt beside the files of
torch.distributed.checkpoint: `.metadata` and one `__<rank>_0.distcp` per writing rank).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mt.events import JSON_ERRORS

FORMAT = "mt-checkpoint"
FORMAT_VERSION = 1
FILES = ("model.pt", "optim.pt", "train.pt")
SHARDED_FILES = ("train.pt", ".metadata")  # and every shard file the manifest lists
LAYOUTS = {"full": FILES, "sharded": SHARDED_FILES}


class CheckpointError(ValueError):
    """A checkpoint folder that is not a complete, intact checkpoint of this format."""


def verify(path: Path) -> dict[str, Any]:
    """The manifest of an intact checkpoint; raises CheckpointError saying what is wrong."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no manifest.json (incomplete or not an mt checkpoint)") from None
    except (OSError, *JSON_ERRORS) as e:
        raise CheckpointError(f"{path}: unreadable manifest.json: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: manifest.json is not an {FORMAT} manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {manifest.get('version')!r}, expected {FORMAT_VERSION}")
    layout = manifest.get("layout", "full")  # manifests before sharded checkpoints have none
    if layout not in LAYOUTS:
        raise CheckpointError(f"{path}: unknown checkpoint layout {layout!r} (expected full or sharded)")
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise CheckpointError(f"{path}: manifest lists no files")
    for name in LAYOUTS[layout]:
        if not isinstance(listed.get(name), dict):
            raise CheckpointError(f"{path}: manifest lists no {name}")
    names = list(LAYOUTS[layout])
    if layout == "sharded":  # every file DCP wrote is listed, and nothing else lies beside them
        names += sorted(set(listed) - set(names))
        unlisted = sorted({p.name for p in path.iterdir()} - set(listed) - {"manifest.json"})
        if unlisted:
            raise CheckpointError(f"{path}/{unlisted[0]}: not in the manifest (an extra file in a sharded checkpoint)")
    for name in names:
        want = listed[name]
        if not isinstance(want, dict) or not isinstance(name, str) or "/" in name or name in (".", "..", "manifest.json"):
            raise CheckpointError(f"{path}: manifest lists {name!r}, not a file of this folder")
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"{path}/{name}: missing") from None
        if size != want.get("bytes"):
            raise CheckpointError(f"{path}/{name}: {size} bytes, manifest says {want.get('bytes')} (truncated?)")
        sha = hashlib.sha256()
        with open(path / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
        if sha.hexdigest() != want.get("sha256"):
            raise CheckpointError(f"{path}/{name}: sha256 mismatch (corrupted)")
    return manifest
