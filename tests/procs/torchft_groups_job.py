"""A torchft job of several replica groups (torchft 0.2.0) under ``xrun --replica_groups``: CPU, gloo, each step a
Lighthouse quorum across the groups, an all-reduce inside the group and a commit, as torchft's ``train_ddp.py``
does with synthetic data. A step that does not commit (a peer group lost) is tried again, as torchft's optimizer
wrapper skips it; a group started again (``TORCHELASTIC_RESTART_COUNT`` above 0) heals from its peer. ``SLEEP``
seconds between steps: the time a real step computes, outside the quorum. ``torchft_groups_job.py STEPS SLEEP``;
prints ``TORCHFT group <g> rank <r> pid <pid> meets at <MASTER_ADDR>`` at the start, ``... step <n> at <wall clock>`` as each step is
committed and ``... done <steps>`` at the end.
"""

import os
import sys
import time

import torch
from torchft_manager import make_manager

STEPS, SLEEP = int(sys.argv[1]), float(sys.argv[2])
GROUP, RANK = os.environ["REPLICA_GROUP_ID"], os.environ["RANK"]
print(f"TORCHFT group {GROUP} rank {RANK} pid {os.getpid()} meets at {os.environ['MASTER_ADDR']}", flush=True)
model = torch.nn.Linear(4, 1)
manager = make_manager(model, step_timeout_s=5)
deadline, last = time.monotonic() + 90, -1
while manager.current_step() < STEPS:
    if time.monotonic() > deadline:
        sys.exit(f"group {GROUP} rank {RANK}: only {manager.current_step()} of {STEPS} steps in 90 s")
    manager.start_quorum()
    manager.allreduce(torch.ones(1)).wait()
    manager.should_commit()
    if manager.current_step() != last:
        last = manager.current_step()
        print(f"TORCHFT group {GROUP} rank {RANK} step {last} at {time.time():.3f}", flush=True)
    time.sleep(SLEEP)
print(f"TORCHFT group {GROUP} rank {RANK} done {manager.current_step()}", flush=True)
manager.shutdown()
