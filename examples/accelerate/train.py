"""Hugging Face Accelerate under mt, resumed exactly: `mt launch examples/accelerate/train.py --nproc 2`.

`c` / `mt ckpt` saves (`accelerator.save_state`: model, optimizer, scheduler, every process's RNG
and this script's step), `s` / `mt stop` / SIGTERM saves and stops, and `mt resume` continues from
the newest save with every loss equal to an uninterrupted run's. What makes it exact (docs/library.md,
"Accelerate"): the shuffle is a function of (seed, epoch), set with `loader.set_epoch`, and the
RNG a resumed loader draws from on its first `next()` is set back to the saved state after it.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader, TensorDataset

import mt

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--batch", type=int, default=8, help="samples per process and step")
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--save-every", type=int, default=1000)
p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to watch it at leisure")
args = p.parse_args()

# a seedable sampler: each epoch's shuffle is drawn from (seed, epoch), not from where an RNG happens to be;
# cpu=True where there is no GPU: without it Accelerate runs each CPU process alone (DistributedType.NO)
accelerator = Accelerator(cpu=not torch.cuda.is_available(),
                          dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
run = mt.init(config=vars(args), max_steps=args.steps, effective_batch=args.batch * accelerator.num_processes,
              device="cpu" if accelerator.device.type == "cpu" else None,  # a GPU: mt asks CUDA its name
              precision="fp32" if accelerator.mixed_precision == "no" else accelerator.mixed_precision, grad_clip=1.0)

torch.manual_seed(0)  # the same data and weights on every process
x_all = torch.randn(200, 16)
y_all = (x_all @ torch.randn(16, 4) + 0.5 * torch.randn(200, 4)).argmax(dim=1)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 4))
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
loader = DataLoader(TensorDataset(x_all, y_all), batch_size=args.batch, shuffle=True, drop_last=True)
model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)


class Progress:
    """The script's own part of a save: the step it reached (save_state keeps what register_for_checkpointing names)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


progress = Progress()
accelerator.register_for_checkpointing(progress)
if run.resume_from:  # the newest save this run reported: model, optimizer, scheduler, RNG states, step
    accelerator.load_state(str(run.resume_from))


def save(step: int) -> None:
    progress.step = step
    path = run.dir / "ckpt" / f"step{step}"   # in the run directory (docs/library.md, "Where to save")
    part = path.with_name(f".{path.name}.part")  # renamed whole: a kill mid-save leaves the previous one
    accelerator.save_state(str(part))  # every process writes its RNG state there
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        os.replace(part, path)
        run.checkpoint_saved(path, step)  # answers `mt ckpt`; a resumed attempt gets it as run.resume_from
    accelerator.wait_for_everyone()


def epoch_batches(epoch: int, done: int):
    """The epoch's batches after the `done` ones a saved step had trained: the same batches, and the
    same RNG after them, as an attempt that never stopped."""
    loader.set_epoch(epoch)
    if not done:
        yield from loader
        return
    batches = iter(accelerator.skip_first_batches(loader, done))
    saved = torch.get_rng_state()
    first = next(batches)  # draws its workers' seed from torch's RNG, as the loader did at this epoch's start...
    torch.set_rng_state(saved)  # ...where the saved RNG already has that draw behind it
    yield first
    yield from batches


step, per_epoch, stop = progress.step, len(loader), False
while step < args.steps and not stop:
    epoch, done = divmod(step, per_epoch)
    for x, y in epoch_batches(epoch, done):
        step += 1
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ctl = run.step(step, loss=loss.item(), lr=sched.get_last_lr()[0], grad_norm=grad_norm.item())
        if ctl.checkpoint or ctl.stop or step % args.save_every == 0:
            save(step)
        stop = ctl.stop  # mt stop, the s key, or SIGTERM (preemption)
        if stop or step == args.steps:
            break
        time.sleep(args.sleep)
run.finish()
accelerator.end_training()
