"""One rank of the GPU suite: its first CUDA step (a matmul checked against the CPU), then one line
``XRUN_GPU {json}`` with what it saw: the rank variables, its visibility list, torch's device count, its device's
name and UUID, its CPU affinity and memory nodes, when the first CUDA step finished (``time.time()``), and whether it
was forked from ``--preload torch``'s helper."""

import json
import os
import shutil
import sys
import time

PRELOADED = "torch" in sys.modules  # forked from xrun --preload torch's helper (tests/gpu/test_preload.py)
import torch  # noqa: E402 - after that look

local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
a = torch.randn(512, 512, device="cuda")
b = torch.randn(512, 512, device="cuda")
c = a @ b
torch.cuda.synchronize()
first_step = time.time()
matmul_ok = bool(torch.allclose(c.cpu(), a.cpu() @ b.cpu(), rtol=1e-2, atol=1e-2))
props = torch.cuda.get_device_properties(local)


def status(key):
    with open("/proc/self/status") as handle:
        return next((line.split(":", 1)[1].strip() for line in handle if line.startswith(key + ":")), None)


print("XRUN_GPU " + json.dumps({
    "rank": int(os.environ.get("RANK", "0")),
    "local_rank": local,
    "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    "pid": os.getpid(),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "device_count": torch.cuda.device_count(),
    "device": torch.cuda.current_device(),
    "name": props.name,
    "uuid": str(getattr(props, "uuid", "")),
    "matmul_ok": matmul_ok,
    "first_step": first_step,
    "cpus": sorted(os.sched_getaffinity(0)),
    "cpus_allowed": status("Cpus_allowed_list"),
    "mems_allowed": status("Mems_allowed_list"),
    "omp_threads": os.environ.get("OMP_NUM_THREADS"),
    "numactl": shutil.which("numactl"),
    "preloaded": PRELOADED,
    "bad_fork": torch.cuda._is_in_bad_fork(),
}), flush=True)
