"""NCCL ranks that all-reduce 5 times, say so, then go quiet in ``evaluate`` (the hang watch's silence)."""

import os
import time

import torch
import torch.distributed as dist


def evaluate():
    time.sleep(120)


local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
print("joining", flush=True)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
tensor = torch.ones(1024, device="cuda")
for _ in range(5):
    dist.all_reduce(tensor)
torch.cuda.synchronize()
print("XRUN_GPU_UP", flush=True)
evaluate()
