"""`python -P -m engine.checkpoint.compare FOLDER_A FOLDER_B`: which parameter tensors of two
checkpoints differ bit for bit, in the model's order, with the largest difference; JSON on stdout.

`mt diff --first-divergence` runs it (tui never imports torch). Each folder is verified against
its manifest, every byte hashed, before a file is loaded (weights_only; sharded: the safe DCP
reader, every shard read whole in this one process). Exit 2 with {"error": ...} for a folder
that is not an intact checkpoint.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from mt.contract.checkpoints import CheckpointError, verify


@dataclass
class TensorDiff:
    """One tensor that differs: its name, the largest |A - B|, and how many values differ."""

    name: str
    max_abs_diff: float
    values_differ: int
    values: int


@dataclass
class Comparison:
    """Two checkpoints' model tensors compared, in A's order (a state dict's order is the model's)."""

    tensors: int = 0                                       # compared (in both, same shape and dtype)
    differ: list[TensorDiff] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)    # in both, of another shape or dtype


def model_state(folder: Path) -> dict[str, torch.Tensor]:
    """The model's tensors of an intact checkpoint (hashes checked first); CheckpointError otherwise."""
    manifest = verify(folder, hashes=True)
    if manifest["layout"] == "sharded":
        from engine.checkpoint import sharded
        state = sharded.model_state(folder)
    else:
        from engine.checkpoint import full
        state = full.load_file(folder, "model.pt", "cpu")
    if not isinstance(state, dict):
        raise CheckpointError(f"{folder}/model.pt: not a state dict")
    return {k: v for k, v in state.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> Comparison:
    """Every tensor of `a` against `b`'s of the same name, bit for bit (a NaN equals the same NaN)."""
    out = Comparison(only_b=[k for k in b if k not in a])
    for name, ta in a.items():
        tb = b.get(name)
        if tb is None:
            out.only_a.append(name)
            continue
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            out.mismatched.append(name)
            continue
        out.tensors += 1
        bits_a, bits_b = (t.detach().contiguous().reshape(-1).view(torch.uint8) for t in (ta, tb))
        if torch.equal(bits_a, bits_b):
            continue
        va, vb = (t.detach().reshape(-1).to(torch.float64) if t.is_floating_point() else t.detach().reshape(-1) for t in (ta, tb))
        both_nan = torch.isnan(va) & torch.isnan(vb) if va.is_floating_point() else torch.zeros_like(va, dtype=torch.bool)
        unequal = (va != vb) & ~both_nan
        # equal values can still differ in bits (0.0 and -0.0, NaN payloads): counted, difference 0
        gap = (va - vb).abs()[unequal] if va.is_floating_point() else (va.double() - vb.double()).abs()[unequal]
        worst = float(gap.nan_to_num(nan=math.inf).max()) if gap.numel() else 0.0
        out.differ.append(TensorDiff(name, worst, max(int(unequal.sum()), 1), va.numel()))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m engine.checkpoint.compare FOLDER_A FOLDER_B", file=sys.stderr)
        return 2
    try:
        a, b = (model_state(Path(p)) for p in argv)
    except CheckpointError as e:
        print(json.dumps({"error": str(e)}))
        return 2
    print(json.dumps(asdict(compare(a, b))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
