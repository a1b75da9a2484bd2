"""What the job tests on the cluster share: the remote interpreter, and the resuming rank script of the restart tests.

``TRAIN``: real torch gloo ranks that checkpoint every step to a file (the nodes share the filesystem) and resume
from it; its environment picks the failure: ``CRASH_RANK`` exits 5 at step 3 of attempt 0, ``ALWAYS_FAIL`` exits 6
in every attempt, ``STEP_S`` paces the steps, ``STEPS`` (6) ends the run. The crashing rank leaves a key in the store at
``MASTER_ADDR:MASTER_PORT``; a rank that finds it at its start exits 9 (``LEFTOVER``): each attempt's store is new. Every process of a job carries
``MARK=<the job's own value>`` in its environment, so a test finds whatever the job left on the nodes.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from tests.conftest import ROOT

MARK = "XRUN_TEST_MARK"

TRAIN = r"""
import os, socket, sys, time
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("STARTED", attempt, os.environ["RANK"], repr(time.time()), flush=True)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, ckpt = dist.get_rank(), os.environ["CKPT"]
# the agent's store at MASTER_PORT (issue 39 §1), opened as torchft's Manager does: new for every attempt
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
if store.check(["a rank crashed"]):
    print("LEFTOVER", attempt, rank, store.get("a rank crashed").decode(), flush=True)
    os._exit(9)
step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print("RESUME", attempt, rank, step, os.environ["MASTER_PORT"], os.environ["TORCHELASTIC_MAX_RESTARTS"], flush=True)
if os.environ.get("ALWAYS_FAIL") == str(rank):
    os._exit(6)
while step < int(os.environ.get("STEPS", "6")):
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    step += 1
    if rank == 0:
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(ckpt + ".tmp", ckpt)
    dist.barrier()
    if attempt == 0 and step == 3 and rank == int(os.environ.get("CRASH_RANK", "-1")):
        store.set("a rank crashed", socket.gethostname())
        print("CRASH", rank, socket.gethostname(), repr(time.time()), flush=True)
        sys.stdout.flush()
        os._exit(5)
    time.sleep(float(os.environ.get("STEP_S", "0")))
print("DONE", attempt, rank, step, flush=True)
dist.destroy_process_group()
# torch 2.13's gloo can abort at interpreter teardown after a clean destroy_process_group() (examples/train_ddp.py)
sys.stderr.flush()
os._exit(0)
"""


def python_wrapper(path: Path, prelude: str = "") -> str:
    """Write an interpreter at ``path`` that runs ``prelude`` (shell lines) first, then this tree's Python first on
    PYTHONPATH (over ssh nothing else would); return its path for ``--python``."""
    path.write_text(f'#!/bin/sh\n{prelude}PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


def started(proc, ranks, timeout=60.0):
    """Read the job's output on a thread; return its lines (still growing) once ``ranks`` ranks resumed."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + timeout
    while sum("RESUME" in line for line in lines) < ranks:
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.05)
    return lines


def read_lines(stream, into: list[str]) -> None:
    """Append the stream's lines to ``into`` from a thread, as they come."""
    threading.Thread(target=lambda: into.extend(iter(stream.readline, "")), daemon=True).start()


def wait_for(lines: list[str], test, what: str, timeout: float, *, proc=None, err: list[str] | None = None) -> float:
    """Wait until a line passes ``test``; return when it was seen (``time.monotonic()``), fail naming ``what``.
    With ``proc``, fail as soon as it has ended instead of waiting out ``timeout``; ``err`` (its stderr's lines, as
    they come) goes into the failure too, since a job that never started says why there."""
    deadline = time.monotonic() + timeout
    while not any(test(line) for line in list(lines)):
        ended = proc is not None and proc.poll() is not None
        if ended:
            time.sleep(0.5)  # the reader threads drain what the process wrote last
        if ended or time.monotonic() >= deadline:
            if any(test(line) for line in list(lines)):
                break
            why = f"the job ended with code {proc.returncode}" if ended else f"not within {timeout:g} s"
            raise AssertionError(f"no {what}: {why}: stdout: {''.join(lines)[-3000:]!r} stderr: "
                                 f"{''.join(err or [])[-3000:]!r}")
        time.sleep(0.05)
    return time.monotonic()
