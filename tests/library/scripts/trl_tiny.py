"""A tiny GPT-2, word tokenizer and texts made here (no hub) for TRL's trainers, and a DPO run with LoRA through MtCallback.

`trl_tiny.py make DIR` saves the model and tokenizer (save_pretrained) and `DIR/data.jsonl` (32 texts: examples/trl/train.py
trains on them with SFT); `trl_tiny.py dpo DIR OUT STEPS` trains with DPO (the adapter-less model is the reference)."""
import json
import sys
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from trl import DPOConfig, DPOTrainer

from mt.integrations.hf import MtCallback

WORDS = [f"w{i}" for i in range(60)]

if sys.argv[1] == "make":
    out = Path(sys.argv[2])
    vocab = {"[PAD]": 0, "[EOS]": 1, "[UNK]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]").save_pretrained(out)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=len(vocab), n_positions=64,
                               bos_token_id=1, eos_token_id=1, pad_token_id=0)).save_pretrained(out)
    g = torch.Generator().manual_seed(0)   # texts of 6..23 words: TRL's num_tokens differs from step to step
    lengths = torch.randint(6, 24, (32,), generator=g).tolist()
    texts = [" ".join(WORDS[j] for j in torch.randint(len(WORDS), (n,), generator=g).tolist()) for n in lengths]
    (out / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    sys.exit(0)

model_dir, out, steps = Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
half = [json.loads(line)["text"].split() for line in (model_dir / "data.jsonl").read_text().splitlines()]
# a text's first half, and two continuations: its own second half preferred to the next text's
pairs = {"prompt": [" ".join(w[:len(w) // 2]) for w in half], "chosen": [" " + " ".join(w[len(w) // 2:]) for w in half],
         "rejected": [" " + " ".join(w[len(w) // 2:]) for w in half[1:] + half[:1]]}
args = DPOConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=4, logging_steps=1, save_strategy="no", report_to=[],
                 use_cpu=True, disable_tqdm=True, learning_rate=1e-2, max_length=32, seed=0)
lora = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, lora_dropout=0.0, task_type="CAUSAL_LM")
mt_cb = MtCallback()
DPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=args, train_dataset=Dataset.from_dict(pairs),
           processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir), peft_config=lora,
           callbacks=[mt_cb]).train(resume_from_checkpoint=mt_cb.resume_from)
