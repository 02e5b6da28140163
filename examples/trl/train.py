"""TRL's SFTTrainer with a peft LoRA adapter under mt: `mt launch examples/trl/train.py -- --model PATH --data FILE.jsonl`.

`--model` is a causal LM folder or hub name with its tokenizer (`save_pretrained`'s output); `--data` a JSON-lines
file of `{"text": ...}`. `MtCallback` does the rest (docs/library.md, "TRL and peft"): the header shows TRL's
`num_tokens` as tok/s, the Trainer's fractional epoch, and the parameters LoRA trains of all of them; `c` / `mt ckpt`
saves (`<out>/checkpoint-<step>`: the adapter, optimizer, scheduler, RNG and data position), `s` / `mt stop` / SIGTERM
saves and stops, and `mt resume` continues from the newest save with every loss equal to an uninterrupted run's.
"""
import argparse
import json
import time

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig, SFTTrainer

from mt.integrations.hf import MtCallback

p = argparse.ArgumentParser()
p.add_argument("--model", required=True, help="a causal LM and its tokenizer: a folder, or a hub name already cached")
p.add_argument("--data", required=True, help='JSON lines of {"text": ...}')
p.add_argument("--out", default="trl-out", help="the Trainer's output_dir: its checkpoints")
p.add_argument("--steps", type=int, default=200)
p.add_argument("--batch", type=int, default=4, help="samples per process and step")
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--lora-r", type=int, default=8)
p.add_argument("--target", nargs="+", default=None, help="the modules LoRA adapts (default: peft's choice for the model)")
p.add_argument("--max-length", type=int, default=512)
p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to watch it at leisure")
args = p.parse_args()


class Sleep(TrainerCallback):
    def on_step_end(self, *_, **__):
        time.sleep(args.sleep)


with open(args.data) as f:
    texts = [json.loads(line)["text"] for line in f if line.strip()]
mt_cb = MtCallback()
trainer = SFTTrainer(
    model=AutoModelForCausalLM.from_pretrained(args.model),
    processing_class=AutoTokenizer.from_pretrained(args.model),
    train_dataset=Dataset.from_dict({"text": texts}),
    # save_strategy "no": mt asks for the saves (c, s, SIGTERM); the Trainer's own schedule works beside them too
    args=SFTConfig(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=args.lr,
                   logging_steps=1, save_strategy="no", report_to=[], max_length=args.max_length, seed=0, disable_tqdm=True,
                   # TRL's default is bf16, which a CPU refuses
                   use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
    peft_config=LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules=args.target, lora_dropout=0.0,
                           task_type="CAUSAL_LM"),
    callbacks=[Sleep(), mt_cb],
)
trainer.train(resume_from_checkpoint=mt_cb.resume_from)
