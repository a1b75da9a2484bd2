"""An elastic training toy: checkpoint every step, resume from it after any restart (torch elastic's walk-through).

    xrun --elastic --nnodes 1:2 --max_restarts 2 examples/train_elastic.py --steps 30
    xrun -H hosts --elastic --min_nodes 2 --max_restarts 3 examples/train_elastic.py --checkpoint /shared/ck.pt

Each restart (a rank failed, a node left, a node joined) kills every worker and starts them again, possibly
with a different world size, so the state that matters lives in the checkpoint: the step, the model and the
optimizer. Rank 0 writes it atomically after every step; every rank loads it at start. A small tiny model
trained with DDP (gloo on CPU, NCCL when each rank has a GPU); ``--step_time`` slows the steps down so that
nodes can come and go while it runs.

Fault injection for tests and demos: ``--crash_rank R --crash_at_step K`` makes rank R exit with
``--crash_code`` (default 7) when it reaches step K, on the first attempt only (``TORCHELASTIC_RESTART_COUNT``
is 0), or on every attempt with ``--crash_always``. It exits at once, as a crash does (``os._exit``): a graceful
exit would first run the interpreter's teardown, which closes the process group's sockets while the process
lives on for a while, so a peer that aborts on "connection closed by peer" can die before the rank that caused it.

Every rank prints ``step S rank R/W restart K loss L``; rank 0 ends with one JSON line (``"done": true``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step_time", type=float, default=0.2, help="seconds to sleep per step")
    parser.add_argument("--checkpoint", default="checkpoint.pt", help="path every node can read (shared storage)")
    parser.add_argument("--crash_rank", type=int, default=None)
    parser.add_argument("--crash_at_step", type=int, default=None)
    parser.add_argument("--crash_code", type=int, default=7)
    parser.add_argument("--crash_always", action="store_true", help="crash on every attempt, not only the first")
    parser.add_argument("--local_rank", type=int, default=None, help="accepted for DeepSpeed-style launchers")
    return parser.parse_args()


def save_checkpoint(path: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, world: int) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save({"step": step, "world": world, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, path)  # a crash mid-write never leaves half a checkpoint


def main() -> int:
    args = parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > local_rank
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo")
    print(f"start rank {rank}/{world} local {local_rank} on {socket.gethostname()} restart {restart}", flush=True)

    torch.manual_seed(0)
    model = ToyModel().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    first = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["step"] + 1
        print(f"resume rank {rank} from step {state['step']} (saved by a world of {state['world']})", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    loss_fn = nn.MSELoss()
    data = torch.Generator().manual_seed(1000 + rank)

    for step in range(first, args.steps):
        if (
            rank == args.crash_rank
            and step == args.crash_at_step
            and (args.crash_always or restart == 0)
        ):
            print(f"rank {rank} crashing at step {step} (restart {restart})", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(args.crash_code)
        time.sleep(args.step_time)
        x = torch.randn(20, 10, generator=data).to(device)
        y = torch.randn(20, 5, generator=data).to(device)
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} rank {rank}/{world} restart {restart} loss {loss.item():.4f}", flush=True)
        if rank == 0:
            save_checkpoint(args.checkpoint, step, model, optimizer, world)

    dist.barrier()
    if rank == 0:
        summary = {"done": True, "steps": args.steps, "resumed_from": first, "world": world, "restart": restart}
        print(json.dumps(summary))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # torch 2.13's gloo backend can abort at interpreter teardown after a clean destroy_process_group()
    # ("terminate called without an active exception"; see examples/train_ddp.py): leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
