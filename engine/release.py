"""`python -P -m engine.release --run-dir RUN --checkpoint FOLDER --out DIR`: a checkpoint's weights as
safetensors, for `mt release` (tui/report/release.py), which never imports torch.

mt's GPT and a factory model: `model.safetensors` (the unwrapped model's state dict, every tensor
its own copy, so tied weights load back with `load_state_dict`); a Hugging Face model: its own
`save_pretrained` folder (config.json and model.safetensors). Exit 0, or 2 with one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from mt.contract import checkpoints
from mt.contract.config import Config, ConfigError
from mt.contract.preset import load_config_json


def model_state(folder: Path) -> dict[str, torch.Tensor]:
    """The model's whole state dict of an intact checkpoint (every byte verified), on the CPU."""
    manifest = checkpoints.verify(folder)
    if manifest["layout"] == "sharded":
        from engine.checkpoint import sharded
        return sharded.model_state(folder)
    from engine.checkpoint import full
    return full.load_file(folder, "model.pt", "cpu")


def write_weights(cfg: Config, state: dict[str, torch.Tensor], out: Path) -> list[str]:
    """The weights into `out` (an existing empty folder); the names of the files written."""
    from safetensors.torch import save_file

    from engine.kinds import kind_of

    kind = kind_of(cfg)
    if kind.saves_pretrained:
        from engine.weights import fit_problems

        model = kind.build(cfg)
        problems = fit_problems(model, state, "the checkpoint")
        if problems:
            raise checkpoints.CheckpointError(f"the checkpoint does not fit the run's model: {'; '.join(problems)}")
        model.load_state_dict(state)
        model.config.use_cache = True  # training turned it off; a downstream generate wants it
        model.save_pretrained(out, safe_serialization=True)
    else:
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(cfg, out)
    return sorted(p.name for p in out.iterdir())


def write_tokenizer(cfg: Config, out: Path) -> None:
    """The run's own tokenizer beside the weights (a downstream user encodes as the run did): an HF model
    folder's as its save_pretrained files, [data] tokenizer's file as tokenizer.json; none for bytes."""
    from engine.samples import HfTokenizer, TokenizerFile, codec_for

    codec = codec_for(cfg)
    if isinstance(codec, HfTokenizer):
        codec.tok.save_pretrained(out)
    elif isinstance(codec, TokenizerFile):
        codec.tok.save(str(out / "tokenizer.json"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.release", description=__doc__)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        cfg = load_config_json(args.run_dir / "config.json")
        files = write_weights(cfg, model_state(args.checkpoint), args.out)
    except (ConfigError, checkpoints.CheckpointError) as e:
        print(str(e).splitlines()[0], file=sys.stderr)
        return 2
    print(json.dumps({"files": files}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
