"""A rank of ``xrun --replica_groups`` that needs no torch (tests/test_replica_groups.py): prints one JSON line
(its group, rank within it, ``TORCHELASTIC_RESTART_COUNT``, pid, and the pid that imported tests/procs/preload_mark.py:
the preload helper's when it was forked from it). ``group_rank.py FAIL``: the rank ``FAIL`` (``<group>.<rank>``)
exits 3 after 0.2 s, every run; every other rank sleeps 30 s (the job's failure stops it)."""

import json
import os
import sys
import time

import preload_mark

GROUP, RANK = os.environ["REPLICA_GROUP_ID"], os.environ["RANK"]
print(json.dumps({"group": int(GROUP), "rank": int(RANK), "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
                  "pid": os.getpid(), "mark": preload_mark.PID}), flush=True)
if f"{GROUP}.{RANK}" == sys.argv[1]:
    time.sleep(0.2)
    sys.exit(3)
time.sleep(30)
