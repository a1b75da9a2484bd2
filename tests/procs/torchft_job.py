"""A minimal torchft job (torchft 0.2.0): one replica group whose ``Manager`` opens the store at
``MASTER_ADDR:MASTER_PORT`` as a client (``is_master=False``), as it does under torchrun; CPU, gloo, a few steps of
a quorum and an all-reduce. ``torchft_job.py STEPS``; needs ``TORCHFT_LIGHTHOUSE`` and ``REPLICA_GROUP_ID``. Prints
``TORCHFT <rank> <steps committed> <sum>`` per rank at the end.
"""

import os
import sys

import torch
from torchft_manager import make_manager

STEPS = int(sys.argv[1])
model = torch.nn.Linear(4, 1)
manager = make_manager(model, step_timeout_s=10)
total = torch.zeros(1)
for _ in range(STEPS):
    manager.start_quorum()
    value = torch.tensor([float(manager.num_participants())])
    manager.allreduce(value).wait()
    total += value
    if not manager.should_commit():
        sys.exit(f"step {manager.current_step()} did not commit")
print("TORCHFT", os.environ["RANK"], manager.current_step(), float(total.item()), flush=True)
manager.shutdown()
