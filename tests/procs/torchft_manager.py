"""The torchft 0.2.0 ``Manager`` both torchft test jobs make (torchft_job.py, torchft_groups_job.py): CPU, gloo,
``min_replica_size=1``, the replica id ``group_<REPLICA_GROUP_ID>``, short timeouts so that a lost peer costs
seconds. Imported as a sibling module: the jobs run as scripts, their folder first on ``sys.path``."""

import os
from datetime import timedelta

import torch
from torchft import Manager, ProcessGroupGloo


def make_manager(model: torch.nn.Module, *, step_timeout_s: float) -> Manager:
    """``step_timeout_s`` bounds gloo's collectives and the Manager's own waits; quorum and connect get 10 s."""
    return Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=step_timeout_s)),
        min_replica_size=1,
        load_state_dict=model.load_state_dict,
        state_dict=model.state_dict,
        replica_id=f"group_{os.environ['REPLICA_GROUP_ID']}",
        timeout=timedelta(seconds=step_timeout_s),
        quorum_timeout=timedelta(seconds=10),
        connect_timeout=timedelta(seconds=10),
    )
