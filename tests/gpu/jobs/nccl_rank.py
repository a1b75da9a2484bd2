"""NCCL under xrun: init_process_group("nccl"), an all-reduce of a CUDA tensor, a barrier, a clean exit."""

import json
import os
import time

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
started = time.time()
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank, world = dist.get_rank(), dist.get_world_size()
tensor = torch.full((1024,), float(rank + 1), device="cuda")
dist.all_reduce(tensor)
torch.cuda.synchronize()
dist.barrier()
dist.destroy_process_group()
print("XRUN_GPU " + json.dumps({
    "rank": rank,
    "world_size": world,
    "backend": "nccl",
    "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    "sum": tensor[0].item(),
    "expected": world * (world + 1) / 2,
    "seconds": round(time.time() - started, 3),
}), flush=True)
