"""A job under NVIDIA nvidia-resiliency-ext's ``inprocess.Wrapper``, modelled on its
``examples/inprocess/basic_example.py``: CPU, gloo with a short timeout, DDP steps on synthetic data.

``nvrx_wrapper_job.py STEPS VICTIM KILL_AT DIR``: the rank started as VICTIM ``kill -9``s itself at step KILL_AT of
the first Wrapper iteration; the others recover in place. Each rank writes ``DIR/<initial rank>.json`` at the end:
its pid at the start and the end, the world it finished with, the steps it resumed at, and whether its monitor
daemon was still running then; ``DIR/<initial rank>.monitor`` holds that daemon's pid from the start on.
"""

import datetime
import json
import logging
import os
import signal
import sys
import time

import nvidia_resiliency_ext.inprocess as inprocess
import torch

STEPS, VICTIM, KILL_AT, OUT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
INITIAL_RANK, START_PID = int(os.environ["RANK"]), os.getpid()
state = {"step": 0, "resumed_at": [], "worlds": []}  # lives across the Wrapper's iterations: in-process recovery



AGENT_STORE = os.environ.get("NVRX_STORE") == "agent"


@inprocess.Wrapper(
    # the Wrapper's store at MASTER_PORT + 2, the application's at MASTER_PORT + 1, as NVRx's example does; or
    # (NVRX_STORE=agent) both in the store xrun's agent hosts at MASTER_PORT, which outlives rank 0
    store_kwargs={} if AGENT_STORE else {"port": int(os.environ["MASTER_PORT"]) + 2},
    health_check=None,  # CPU: no CUDA health check
    soft_timeout=datetime.timedelta(seconds=30),
    hard_timeout=datetime.timedelta(seconds=40),
    heartbeat_timeout=datetime.timedelta(seconds=20),
    monitor_process_interval=datetime.timedelta(seconds=0.2),
    monitor_thread_interval=datetime.timedelta(seconds=0.2),
    last_call_wait=datetime.timedelta(seconds=0.2),
)
def train(call_wrapper: inprocess.CallWrapper = None):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    iteration = call_wrapper.iteration
    monitor = call_wrapper.monitor_process.process_monitor_proc  # the daemon it forked: a double fork and setsid
    if iteration == 0:
        with open(os.path.join(OUT, f"{INITIAL_RANK}.monitor"), "w") as f:
            f.write(str(monitor.pid))
    port = int(os.environ["MASTER_PORT"]) + (0 if AGENT_STORE else 1)
    store = torch.distributed.PrefixStore(f"app{iteration}", torch.distributed.TCPStore(
        host_name=os.environ["MASTER_ADDR"], port=port, world_size=world, is_master=rank == 0 and not AGENT_STORE,
        multi_tenant=True, wait_for_workers=not AGENT_STORE, use_libuv=True))
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                         timeout=datetime.timedelta(seconds=2))
    state["resumed_at"].append(state["step"])
    state["worlds"].append(world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while state["step"] < STEPS:
        if iteration == 0 and INITIAL_RANK == VICTIM and state["step"] == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        model(torch.rand(8, 16)).square().mean().backward()
        opt.step()
        state["step"] += 1
        time.sleep(0.01)
    torch.distributed.barrier()
    with open(os.path.join(OUT, f"{INITIAL_RANK}.json"), "w") as f:
        json.dump({"start_pid": START_PID, "end_pid": os.getpid(), "world": world, "rank": rank,
                   "resumed_at": state["resumed_at"], "worlds": state["worlds"], "monitor_running": monitor.is_running()}, f)
    print(f"rank {INITIAL_RANK} done as rank {rank} of {world}, resumed at {state['resumed_at']}", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    train()
