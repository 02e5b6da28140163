"""The engine vs the Hugging Face `Trainer` on one tiny GPT-2, side by side in one script.

    .venv/bin/python bench/engine_vs_hf_trainer.py [--rounds 2] [--steps 150] [--nproc 1 2] [--last 50] [--threads N]

Both train the same model (built from a gpt2 config with the same seed: the same initial
weights, nothing downloaded), on the same byte windows of a generated text (`engine/data.py`
builds them for both), with the same batch (micro 8 x accum 2 per rank), ranks (CPU, gloo),
AdamW (the engine's own param groups, handed to the Trainer), schedule (warmup + cosine, the
engine's `lr_at` as the Trainer's LambdaLR) and clipping. Each side keeps its own sampler and
dropout stream, as a user of either would. Runs engine and Trainer alternately; reports the
median tokens/s of the period between consecutive optimizer steps (everything a step costs,
logging included), their ratio, and the loss over the last N steps of both: mean, std and a
two-sample Kolmogorov-Smirnov test. Needs the hf extra (transformers, accelerate).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mt.contract.config import HF_OFFLINE
from mt.contract.jsonl import read_events
from mt.contract.preset import config_from_dict, load_config_json

CONFIG = {
    "run": {"name": "bench", "seed": 1},
    "launch": {"device": "cpu"},
    "model": {"kind": "hf", "seq_len": 64,
              "hf": {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256, "n_positions": 64}},
    "data": {"source": "text", "val_fraction": 0.0},
    "train": {"micro_batch_size": 8, "grad_accum_steps": 2, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10,
              "grad_clip": 1.0, "log_every": 1},
    "checkpoint": {"every_steps": 0},
}


def trainer_worker(config_path: str, out_path: str) -> None:
    """One rank of the Trainer side (under torchrun for several): the engine's model, data and optimizer."""
    import torch
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from engine.data import build_splits
    from engine.kinds.hf import build_hf_model
    from engine.optim import build_optimizer, lr_at

    cfg = load_config_json(config_path)
    t = cfg.train
    windows = build_splits(cfg).train  # CausalLM items: ({"input_ids", "labels"}, index)

    class Windows(Dataset):
        def __len__(self) -> int:
            return len(windows)

        def __getitem__(self, i: int) -> dict:
            return windows[i][0]

    torch.manual_seed(cfg.run.seed)  # the engine's seeding before it builds the model: the same weights
    model = build_hf_model(cfg)
    # gpt2 leaves loss_type unset, so the Trainer counts all 64 labels of a row for the mean where
    # the model's shifted loss has 63: its logged loss (and gradient) would be 63/64 of the true one
    model.loss_type = "ForCausalLM"
    opt = build_optimizer(model, t, torch.device("cpu"))
    # LambdaLR's step k (0-based) is the engine's optimizer step k + 1
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_at(k + 1, t) / t.lr)
    marks: list[float] = []
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    args = TrainingArguments(
        output_dir=str(Path(out_path).parent / "trainer"), per_device_train_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.grad_accum_steps, max_steps=t.max_steps, max_grad_norm=t.grad_clip,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=cfg.run.seed,
        dataloader_num_workers=cfg.data.num_workers, dataloader_pin_memory=False, dataloader_drop_last=True,
        remove_unused_columns=False, ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
    )
    Trainer(model=model, args=args, train_dataset=Windows(), optimizers=(opt, sched), callbacks=[Clock()]).train()
    if int(os.environ.get("RANK", 0)) == 0:
        Path(out_path).write_text(json.dumps({"marks": marks, "losses": losses}))


def run(nproc: int, args: list[str], env: dict[str, str]) -> None:
    if nproc == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def median_period(marks: list[float], warmup: int) -> float:
    return statistics.median(b - a for a, b in zip(marks[warmup:], marks[warmup + 1:]))


def ks(a: list[float], b: list[float]) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov: the statistic D and its asymptotic p-value."""
    xs = sorted(set(a) | set(b))
    d = max(abs(sum(v <= x for v in a) / len(a) - sum(v <= x for v in b) / len(b)) for x in xs)
    n = len(a) * len(b) / (len(a) + len(b))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(1.0, max(0.0, p))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--last", type=int, default=50, help="steps at the end whose losses are compared")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (default: the cores / ranks)")
    ap.add_argument("--trainer-worker", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.trainer_worker:
        return trainer_worker(*a.trainer_worker)
    from tests.corpus import write_corpus

    warmup = 10
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        text = write_corpus(Path(tmp) / "corpus.txt", 2_000_000)
        for nproc in a.nproc:
            env = dict(os.environ, **HF_OFFLINE, OMP_NUM_THREADS=str(a.threads or max(1, (os.cpu_count() or 2) // nproc)),
                       PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
            eng, hf, eng_loss, hf_loss = [], [], [], []
            for r in range(a.rounds):
                raw = json.loads(json.dumps(CONFIG))
                raw["launch"]["nproc_per_node"] = nproc
                raw["train"]["max_steps"] = a.steps
                raw["data"]["path"] = str(text)
                cfg = config_from_dict(raw, "bench")
                d = Path(tmp) / f"n{nproc}-r{r}"
                d.mkdir()
                (d / "config.json").write_text(json.dumps(cfg.to_dict()))
                tokens = nproc * cfg.train.micro_batch_size * cfg.train.grad_accum_steps * cfg.model.seq_len
                for side in ("engine", "trainer") if r % 2 == 0 else ("trainer", "engine"):
                    if side == "engine":
                        run(nproc, ["-m", "engine", "--run-dir", str(d)], env)
                        steps = [e for e in read_events(d / "events.jsonl") if e["kind"] == "step"]
                        eng.append(tokens / median_period([e["t"] for e in steps], warmup))
                        eng_loss.append([e["loss"] for e in steps])
                    else:
                        run(nproc, [__file__, "--trainer-worker", str(d / "config.json"), str(d / "trainer.json")], env)
                        got = json.loads((d / "trainer.json").read_text())
                        hf.append(tokens / median_period(got["marks"], warmup))
                        hf_loss.append(got["losses"])
                print(f"{nproc} rank(s), round {r + 1}: engine {eng[-1]:.0f} tok/s, Trainer {hf[-1]:.0f} tok/s, "
                      f"ratio {eng[-1] / hf[-1]:.3f}; final loss {eng_loss[-1][-1]:.3f} vs {hf_loss[-1][-1]:.3f}", flush=True)
            last_e = [x for curve in eng_loss for x in curve[-a.last:]]
            last_h = [x for curve in hf_loss for x in curve[-a.last:]]
            d_stat, p = ks(last_e, last_h)
            ratio = statistics.median(e / h for e, h in zip(eng, hf))
            results.append({"nproc": nproc, "ratio": ratio, "engine_tok_s": statistics.median(eng), "trainer_tok_s": statistics.median(hf),
                            "engine_loss": [statistics.mean(last_e), statistics.stdev(last_e)],
                            "trainer_loss": [statistics.mean(last_h), statistics.stdev(last_h)], "ks_d": d_stat, "ks_p": p})
    for res in results:
        (me, se), (mh, sh) = res["engine_loss"], res["trainer_loss"]
        print(f"{res['nproc']} rank(s): engine / Trainer tokens/s median ratio {res['ratio']:.3f} (goal >= 1.0); "
              f"loss over the last {a.last} steps: engine {me:.4f} +- {se:.4f}, Trainer {mh:.4f} +- {sh:.4f}; "
              f"KS D = {res['ks_d']:.3f}, p = {res['ks_p']:.3f} (p > 0.05: the same distribution)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
