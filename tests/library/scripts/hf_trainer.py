"""A Hugging Face Trainer on a tiny GPT-2 built from a config (no downloads), reporting through MtCallback."""
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from mt.integrations.hf import MtCallback

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200


class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)  # watchable: the test has time to press c

    def on_save(self, args, state, control, **kwargs):
        time.sleep(2.0)  # a save of several control polls, before MtCallback reports it


g = torch.Generator().manual_seed(0)
data = [{"input_ids": (ids := torch.randint(64, (32,), generator=g)), "labels": ids} for _ in range(256)]
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
args = TrainingArguments(output_dir="hf-out", max_steps=steps, per_device_train_batch_size=4, logging_steps=1,
                         save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, learning_rate=1e-3)
mt_cb = MtCallback()
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Slow(), mt_cb])
trainer.train(resume_from_checkpoint=mt_cb.resume_from)
