"""A DeepSpeed job as its users write one: argparse with ``--local_rank`` (DeepSpeed's launcher contract, which
xrun keeps), ``deepspeed.add_config_arguments``, ``init_distributed``, ``initialize`` and a few steps; it reports
what DeepSpeed saw."""

import argparse
import json
import os
import sys

PRELOADED = "torch" in sys.modules  # forked from xrun --preload torch's helper, which imported it (issue 32)
# ruff: noqa: E402 - the imports below come after that look

import deepspeed
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed(dist_backend="gloo")  # CPU ranks: DeepSpeed's own default there needs oneCCL
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "steps_per_print": 1000}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
torch.manual_seed(1 + dist.get_rank())  # each rank its own batch: only the all-reduce keeps the replicas equal
for _ in range(2):
    loss = engine(torch.randn(8, 4)).pow(2).mean()
    engine.backward(loss)
    engine.step()
weights = engine.module.weight.detach()
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "pid": os.getpid(),
                  "ddp": engine.dp_world_size == 2, "local_rank_arg": args.local_rank,
                  "local_rank_env": int(os.environ["LOCAL_RANK"]), "steps": engine.global_steps,
                  "checksum": round(float(weights.sum()), 6), "preloaded": PRELOADED}), flush=True)
os._exit(0)  # as the other jobs: the work is reported, torch 2.13's gloo teardown may abort
