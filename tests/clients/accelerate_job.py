"""A tiny HF accelerate job: prepare a model, take two steps, report what accelerate saw (seeded: the same weights
on every run)."""

import json
import os
import sys

PRELOADED = "torch" in sys.modules  # forked from xrun --preload torch's helper, which imported it (issue 32)
# ruff: noqa: E402 - the imports below come after that look

import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
torch.manual_seed(1 + accelerator.process_index)  # each rank its own batch: only the all-reduce keeps them equal
for _ in range(2):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
weights = accelerator.unwrap_model(model).weight.detach()
print(json.dumps({"rank": accelerator.process_index, "world": accelerator.num_processes, "pid": os.getpid(),
                  "ddp": isinstance(model, torch.nn.parallel.DistributedDataParallel),
                  "checksum": round(float(weights.sum()), 6), "preloaded": PRELOADED}), flush=True)
# torch 2.13's gloo can abort at interpreter teardown after a finished run ("terminate called without an active
# exception"; under torchrun too, see examples/train_ddp.py). The work is reported: leave without that teardown.
os._exit(0)
