"""A no-op rank: records that it ran (pid file with its start time) and exits 0. Never imports torch.

Arguments are ``key=value`` words (launchers may append ``--local_rank=N``; anything else is ignored):
``dir=RUN_DIR`` where ``RUN_DIR/ranks/<pid>`` is written, ``tag=...`` only marks the command line.
"""
import os
import sys
import time

t0 = time.time()
opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
with open(os.path.join(opts["dir"], "ranks", str(os.getpid())), "w") as f:
    f.write(f"{t0!r} {os.environ.get('RANK', '?')}\n")
