"""A tiny transformers Trainer job: a 2-layer BERT built from a config (no download), two steps (seeded: the same
weights on every run)."""

import json
import os
import sys

PRELOADED = "torch" in sys.modules  # forked from xrun --preload torch's helper, which imported it (issue 32)
# ruff: noqa: E402 - the imports below come after that look

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([1 + i % 5, 2, 3, 4]), "labels": torch.tensor(i % 2)}


config = BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
args = TrainingArguments(output_dir=os.environ["CLIENT_OUT"], max_steps=2, per_device_train_batch_size=2,
                         use_cpu=True, report_to=[], ddp_backend="gloo", save_strategy="no", logging_strategy="no")
torch.manual_seed(0)  # the model's initial weights (the Trainer seeds the training itself: args.seed)
trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Data())
trainer.train()
print(json.dumps({"rank": args.process_index, "world": args.world_size, "pid": os.getpid(),
                  "ddp": isinstance(trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel),
                  "checksum": round(float(sum(p.detach().sum() for p in trainer.model.parameters())), 6),
                  "preloaded": PRELOADED}), flush=True)
# torch 2.13's gloo can abort at interpreter teardown after a finished run ("terminate called without an active
# exception"; under torchrun too, see examples/train_ddp.py). The work is reported: leave without that teardown.
os._exit(0)
