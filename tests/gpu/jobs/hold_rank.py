"""GPU memory across the attempts of --max_restarts: each attempt first writes what the driver lists as holding GPU
memory (before it touches the GPU itself), then takes HOLD_GIB GiB; every attempt but the last also starts an orphan
that takes ORPHAN_GIB GiB and sleeps (its own session, as a daemon: the case from the field), then fails.

``hold_rank.py --orphan DIR``: the orphan itself.
"""

import json
import os
import subprocess
import sys
import time

GIB = 1 << 30


def compute_apps():
    """pid -> MiB the driver lists (NVML, else nvidia-smi): read independently of xrun's code."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            found = {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    found[proc.pid] = (proc.usedGpuMemory or 0) // (1 << 20)
            return found
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return {int(p): int(m) for p, m in (line.split(",") for line in out.splitlines() if line.strip())}


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def orphan(folder):
    import torch

    block = torch.empty(int(float(os.environ.get("ORPHAN_GIB", "1")) * GIB), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with open(os.path.join(folder, f"orphan-{os.getpid()}"), "w") as handle:
        handle.write(str(block.numel()))
    time.sleep(600)


def rank(folder):
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    last = int(os.environ["TORCHELASTIC_MAX_RESTARTS"])
    earlier = [json.load(open(os.path.join(folder, name))) for name in sorted(os.listdir(folder))
               if name.startswith("attempt-")]
    job_pids = [p for e in earlier for p in [e["pid"], *e["orphans"]]]
    record = {"attempt": attempt, "pid": os.getpid(), "at_start": time.time(), "listed_at_start": compute_apps(),
              "earlier_alive": [p for p in job_pids if alive(p)], "orphans": []}
    import torch

    block = torch.empty(int(float(os.environ.get("HOLD_GIB", "2")) * GIB), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    if attempt < last:
        child = subprocess.Popen([sys.executable, __file__, "--orphan", folder], start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(folder, f"orphan-{child.pid}")) and time.time() < deadline:
            time.sleep(0.05)
        record["orphans"] = [child.pid]
    record["listed_before_exit"] = compute_apps()
    record["held_bytes"] = block.numel()
    with open(os.path.join(folder, f"attempt-{attempt}.json"), "w") as handle:
        json.dump(record, handle)
    print("XRUN_GPU " + json.dumps({"rank": 0, "attempt": attempt}), flush=True)
    sys.exit(1 if attempt < last else 0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--orphan"]:
        orphan(sys.argv[2])
    else:
        rank(os.environ["XRUN_GPU_DIR"])
