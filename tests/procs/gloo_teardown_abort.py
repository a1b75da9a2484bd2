"""A rank that ends as torch 2.13's gloo teardown abort does (issue 33 §5), every time: it prints its last line,
then libstdc++'s terminate line on stderr, then aborts (SIGABRT, 134); every other rank exits 0 first.

This reproduces the signature a launcher sees, not gloo itself: the real abort comes now and then (about 1 run in
20 of a transformers Trainer job, under torchrun as under xrun; docs/compatibility.md), when a gloo worker
thread is still running as the interpreter tears itself down and libstdc++ calls std::terminate. No torch import:
the test needs the ending, not the collective.
"""

import os
import sys
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} done", flush=True)
if rank != 0:
    sys.exit(0)
time.sleep(0.5)  # the other ranks have ended: rank 0 is the only one that failed
sys.stderr.write("terminate called without an active exception\n")
sys.stderr.flush()
os.abort()
