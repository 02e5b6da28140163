"""TRL's SFTTrainer (or DPOTrainer) with a peft LoRA adapter on a tiny GPT-2 and word tokenizer made here (no hub),
through MtCallback.

`trl_sft.py make DIR` saves the model and tokenizer (save_pretrained); `trl_sft.py DIR OUT STEPS SLEEP` trains them
with SFT, `trl_sft.py dpo DIR OUT STEPS` with DPO (the adapter-less model is the reference)."""
import json
import sys
import time

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, TrainerCallback
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

from mt.integrations.hf import MtCallback

WORDS = [f"w{i}" for i in range(60)]

if sys.argv[1] == "make":
    vocab = {"[PAD]": 0, "[EOS]": 1, "[UNK]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]").save_pretrained(sys.argv[2])
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=len(vocab), n_positions=64,
                               bos_token_id=1, eos_token_id=1, pad_token_id=0)).save_pretrained(sys.argv[2])
    sys.exit(0)

dpo = sys.argv[1] == "dpo"
model_dir, out, steps = sys.argv[1 + dpo], sys.argv[2 + dpo], int(sys.argv[3 + dpo])
sleep = 0.0 if dpo else float(sys.argv[4])


class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(sleep)  # watchable: the test has time to ask for a checkpoint and a stop


g = torch.Generator().manual_seed(0)   # texts of 6..23 words: TRL's num_tokens differs from step to step
texts = [" ".join(WORDS[j] for j in torch.randint(len(WORDS), (int(torch.randint(6, 24, (1,), generator=g)),), generator=g))
         for _ in range(32)]   # 8 steps an epoch
tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir)
args = (DPOConfig if dpo else SFTConfig)(output_dir=out, max_steps=steps, per_device_train_batch_size=4, logging_steps=1,
                                         save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, learning_rate=1e-2,
                                         max_length=32, seed=0)
lora = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, lora_dropout=0.0, task_type="CAUSAL_LM")
mt_cb = MtCallback()
if dpo:   # a prompt's first half, and two continuations: its own second half preferred to another text's
    half = [t.split() for t in texts]
    pairs = {"prompt": [" ".join(w[:len(w) // 2]) for w in half], "chosen": [" " + " ".join(w[len(w) // 2:]) for w in half],
             "rejected": [" " + " ".join(w[len(w) // 2:]) for w in half[1:] + half[:1]]}
    DPOTrainer(model=model, args=args, train_dataset=Dataset.from_dict(pairs),
               processing_class=tokenizer, peft_config=lora, callbacks=[mt_cb]).train(resume_from_checkpoint=mt_cb.resume_from)
    sys.exit(0)
trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": texts}), processing_class=tokenizer,
                     peft_config=lora, callbacks=[Slow(), mt_cb])
trainer.train(resume_from_checkpoint=mt_cb.resume_from)
# TRL's own token totals by step (this attempt's), for the test to hold mt's tokens to
print("num_tokens", json.dumps({h["step"]: h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h}))
