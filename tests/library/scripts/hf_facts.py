"""A Hugging Face Trainer on a tiny GPT-2 built from a config (no downloads), counting its tokens: argv lr steps."""
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from mt.integrations.hf import MtCallback

lr, steps = float(sys.argv[1]), int(sys.argv[2])
g = torch.Generator().manual_seed(0)
data = [{"input_ids": (ids := torch.randint(64, (32,), generator=g)), "labels": ids} for _ in range(256)]
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
args = TrainingArguments(output_dir="hf-out", max_steps=steps, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                         logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                         learning_rate=lr, max_grad_norm=0.5, include_num_input_tokens_seen=True)
mt_cb = MtCallback()
Trainer(model=model, args=args, train_dataset=data, callbacks=[mt_cb]).train(resume_from_checkpoint=mt_cb.resume_from)
