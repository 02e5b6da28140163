"""Reading a TensorBoard log back with TensorBoard's own reader, and what events.jsonl says it should hold."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tokens_per_s": "train/tokens_per_s"}


def f32(x: float) -> float:
    """What a TensorBoard scalar (a float32) holds of x."""
    return struct.unpack("f", struct.pack("f", x))[0]


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of one TensorBoard run folder: tag -> [(step, value)] in the reader's order."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def texts(logdir: Path) -> list[str]:
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return [e.tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"] for e in acc.Tensors(tag)]


def expected(events_path: Path) -> dict[str, dict[int, float]]:
    """Per tag, each step's newest value in events.jsonl (a redone step's newer value wins), as float32."""
    out: dict[str, dict[int, float]] = {}
    for line in events_path.read_text().splitlines():
        ev: dict[str, Any] = json.loads(line)
        if ev["kind"] == "step":
            for key, tag in TAGS.items():
                if isinstance(ev.get(key), (int, float)):
                    out.setdefault(tag, {})[ev["step"]] = f32(ev[key])
            for k, v in (ev.get("extra") or {}).items():
                out.setdefault(f"metrics/{k}", {})[ev["step"]] = f32(v)
        elif ev["kind"] == "eval":
            if ev.get("val_loss") is not None:
                out.setdefault("val/loss", {})[ev["step"]] = f32(ev["val_loss"])
            for k, v in (ev.get("metrics") or {}).items():   # [eval] factory's
                out.setdefault(f"metrics/eval/{k}", {})[ev["step"]] = f32(v)
        elif ev["kind"] == "metrics":
            for k, v in ev["values"].items():
                out.setdefault(f"metrics/{k}", {})[ev["step"]] = f32(v)
    return out


def assert_mirrors(logdir: Path, events_path: Path) -> dict[str, list[tuple[int, float]]]:
    """Every tag's steps strictly increase (no duplicate, none backwards) and equal events.jsonl's values."""
    got = scalars(logdir)
    want = expected(events_path)
    train = {t: s for t, s in got.items()}
    assert set(train) == set(want), (sorted(train), sorted(want))
    for tag, series in train.items():
        steps = [s for s, _ in series]
        assert steps == sorted(set(steps)), (tag, steps)
        assert dict(series) == want[tag], tag
    return got
