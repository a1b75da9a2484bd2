"""A torchft 0.2.0 replica-group rank (scenario 16, ``replica_groups``): CPU, gloo with a 5 s timeout, each step a
Lighthouse quorum across the groups, an all-reduce inside the group and a commit, then ``sleep`` seconds of
"compute"; a group started again heals from its peer. The same loop as tests/procs/torchft_groups_job.py.

``key=value`` arguments: ``dir=RUN_DIR``, ``steps=N`` (default 10), ``sleep=S`` (default 1). Appends
``<pid> <group> <restart count> <step> <wall clock>`` to ``RUN_DIR/logs/steps`` at its start (step ``-1``, before
torch is imported) and as each step is committed.
"""
import os
import sys
import time
from datetime import timedelta

opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
steps, pause = int(opts.get("steps", "10")), float(opts.get("sleep", "1"))
group, restart = os.environ["REPLICA_GROUP_ID"], os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
out = os.open(os.path.join(opts["dir"], "logs", "steps"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(out, f"{os.getpid()} {group} {restart} -1 {time.time()!r}\n".encode())

import torch  # noqa: E402
from torchft import Manager, ProcessGroupGloo  # noqa: E402

model = torch.nn.Linear(4, 1)
manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
                  load_state_dict=model.load_state_dict, state_dict=model.state_dict, replica_id=f"group_{group}",
                  timeout=timedelta(seconds=5), quorum_timeout=timedelta(seconds=10),
                  connect_timeout=timedelta(seconds=10))
deadline, last = time.monotonic() + 150, -1
while manager.current_step() < steps and time.monotonic() < deadline:
    manager.start_quorum()
    manager.allreduce(torch.ones(1)).wait()
    manager.should_commit()
    if manager.current_step() != last:
        last = manager.current_step()
        os.write(out, f"{os.getpid()} {group} {restart} {last} {time.time()!r}\n".encode())
    time.sleep(pause)
manager.shutdown()
sys.exit(0 if manager.current_step() >= steps else 1)
