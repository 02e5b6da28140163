"""A PyTorch Lightning Trainer under mt: `mt launch examples/lightning/train.py --nproc 2 -- --steps 200`.

MtCallback reports every optimizer step, saves with the Trainer's own `save_checkpoint` on `c` /
`mt ckpt` and on `s` / `mt stop`, and `mt resume` continues from the newest save (`cb.resume_from`).
Needs the `lightning` extra. The model is a tiny linear regression on CPU (or one GPU a rank).
"""
import argparse
import os
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from mt.integrations.lightning import MtCallback

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to watch it at leisure")
args = p.parse_args()


class Regression(pl.LightningModule):
    def __init__(self, lr: float, sleep: float) -> None:
        super().__init__()
        self.save_hyperparameters()  # the run's config on the dashboard
        torch.manual_seed(0)  # the same weights on every rank
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("abs_err", (self.net(x) - y).abs().mean())  # a logged metric: an extra column of the step
        time.sleep(self.hparams.sleep)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


g = torch.Generator().manual_seed(1)
x = torch.randn(4096, 8, generator=g)
data = DataLoader(TensorDataset(x, x @ torch.arange(1.0, 9.0).unsqueeze(1)), batch_size=8)

world, local = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
cb = MtCallback()
trainer = pl.Trainer(accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=local, num_nodes=world // local,
                     strategy="ddp" if world > 1 else "auto", max_steps=args.steps, callbacks=[cb], logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Regression(args.lr, args.sleep), data, ckpt_path=cb.resume_from)  # None on a first attempt
