"""A rank busy in CUDA work for BUSY_SECONDS: back-to-back matmuls, each waited for, so a stack taken at any time
shows it inside ``busy_cuda_work``."""

import json
import os
import time

import torch


def busy_cuda_work(seconds):
    a = torch.randn(4096, 4096, device="cuda")
    steps = 0
    end = time.time() + seconds
    while time.time() < end:
        a = torch.tanh(a @ a)
        torch.cuda.synchronize()
        steps += 1
    return steps


torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
torch.zeros(1, device="cuda")
print(f"XRUN_GPU_UP {os.environ.get('RANK', '0')}", flush=True)  # one line per rank: none merged
steps = busy_cuda_work(float(os.environ.get("BUSY_SECONDS", "8")))
print("XRUN_GPU " + json.dumps({"rank": int(os.environ.get("RANK", "0")), "steps": steps}), flush=True)
