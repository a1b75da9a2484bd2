"""Scenario 16 (issue 39 §2, opt-in): a replica group's way back. torchft 0.2.0, 2 replica groups × 2 ranks on
this machine (bench/ranks/torchft_groups.py: CPU, gloo 5 s timeout, a step computing 1 s); once group 1's rank 1
has committed step 3 it is ``kill -9``ed. Measured from the kill until both ranks of the restarted group 1 run (their
own start times, before torch's import: ``running_s``, the launcher's part), until group 1 commits its first step
(back in the quorum, healed from group 0: ``back_s``) and until the launcher exits (``exit_s``); every rank must
finish every step, exit 0.

``xrun``: one command, ``xrun --num_gpus 4 --replica_groups 2 --max_restarts 1`` (xrun runs the Lighthouse and
restarts group 1 alone). ``torchrun``: torchft's README way, one ``torchrun --standalone --nproc_per_node 2
--max-restarts 1`` per group (``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS``, ``TORCHFT_LIGHTHOUSE``), beside a
``torchft_lighthouse --min_replicas 1`` started first (its start is not counted); its exit is both torchruns'.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from bench import harness, procs
from bench.scenarios.base import Context, finish, section, unavailable

NAME = "replica_groups"
TITLE = "16. Replica groups (torchft): a rank of group 1 killed -> group 1 back in the quorum"
VARIANTS = ("xrun", "torchrun")
TABLE = {"metrics": [["running_s", "group 1 running again", "s"], ["back_s", "group 1 back in the quorum", "s"],
                     ["exit_s", "launcher exit", "s"]],
         "ratio": "back_s", "references": ["torchrun"], "extra_ratio": "exit_s"}
STEPS, KILL_AT = 10, 3


def run(ctx: Context) -> dict[str, Any]:
    try:
        import torchft  # noqa: F401
    except ImportError as err:
        return unavailable(NAME, TITLE, f"torchft is not installed ({err}): pip install torchft==0.2.0 numpy")
    rounds = ctx.rounds(1, 3)
    picked, skipped = ctx.pick([v for v in VARIANTS if ctx.launchers is None or v in ctx.launchers])
    params = {"groups": 2, "ranks_per_group": 2, "steps": STEPS, "kill_at_step": KILL_AT, "rounds": rounds}
    sec = section(NAME, TITLE, params=params, skipped=skipped, table=TABLE, groups=[], targets=[])
    results = harness.run_rounds(picked, rounds, trial, rng=ctx.rng, label=NAME)
    sec["groups"].append({"label": "2 groups x 2 ranks", "params": params,
                          **harness.summarize_group(results, references=TABLE["references"])})
    return finish(sec)


def trial(variant: str) -> harness.Trial:
    with harness.RunDir() as run:
        tag = procs.new_tag()
        env = harness.bench_env(tag)
        args = harness.rank_args(tag, run, (f"steps={STEPS}", "sleep=1"))
        script = harness.rank_script("torchft_groups.py")
        lighthouse = None
        if variant == "torchrun":
            port = harness.free_port()
            binary = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")  # beside this python's torchft
            lighthouse = subprocess.Popen([binary, "--min_replicas", "1", "--bind", f"[::]:{port}"],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True)
            _wait_listening(port, 60)
            argv = _torchruns(script, args, f"http://localhost:{port}")
        else:
            argv = ["xrun", "--num_gpus", "4", "--no_local_rank", "--replica_groups", "2", "--max_restarts", "1",
                    script, *args]
        proc = harness.start(argv, env=env, console=run.console)
        steps_file = os.path.join(run.path, "logs", "steps")
        try:
            with harness.leave_nothing(proc, tag):
                victim = _wait(lambda: _victim(steps_file), proc, 120)
                if victim is None:
                    return harness.Trial(error=f"group 1 never reached step {KILL_AT} | {run.tail()!r}")
                os.kill(victim, signal.SIGKILL)
                killed = time.time()
                back = _wait(lambda: _back(steps_file), proc, 180)
                again = [float(t) for _, g, r, s, t in _lines(steps_file) if g == "1" and r != "0" and s == "-1"]
                proc.wait(180)
                ended = time.time()
        finally:
            if lighthouse is not None:
                os.killpg(lighthouse.pid, signal.SIGKILL)
                lighthouse.wait()
        done = _lines(steps_file)
        finished = sum(1 for line in done if int(line[3]) == STEPS)
        trial = harness.Trial(exit_code=proc.returncode, metrics={
            "running_s": max(again) - killed if len(again) == 2 else None,
            "back_s": None if back is None else back - killed, "exit_s": ended - killed})
        if proc.returncode != 0 or finished != 4:
            trial.error = f"exit {proc.returncode}, {finished} of 4 ranks finished | {run.tail()!r}"
        return trial


def _torchruns(script: str, args: tuple[str, ...], lighthouse: str) -> list[str]:
    """Both groups' torchruns in one shell, as torchft's README starts them; exits with the first failing code.
    torchrun by its module, so that it runs this interpreter, where torchft is (a ``torchrun`` on PATH may not)."""
    def group(g: int) -> str:
        return (f"REPLICA_GROUP_ID={g} NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE={lighthouse} "
                + shlex.join([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              "--max-restarts", "1", script, *args]))
    return ["sh", "-c", f"{group(0)} & a=$!; {group(1)}; b=$?; wait $a; a=$?; [ $a -ne 0 ] && exit $a; exit $b"]


def _lines(path: str) -> list[list[str]]:
    try:
        with open(path) as f:
            return [line.split() for line in f if len(line.split()) == 5]
    except OSError:
        return []


def _victim(path: str) -> int | None:
    """Group 1's rank that has committed step KILL_AT first, in its first run (group 1 has two ranks: either)."""
    return next((int(p) for p, g, r, s, _ in _lines(path) if g == "1" and r == "0" and int(s) >= KILL_AT), None)


def _back(path: str) -> float | None:
    """When the restarted group 1 first committed a step."""
    return min((float(t) for _, g, r, s, t in _lines(path) if g == "1" and r != "0" and s != "-1"), default=None)


def _wait(find: Any, proc: subprocess.Popen[bytes], timeout_s: float) -> Any:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        found = find()
        if found is not None:
            return found
        if proc.poll() is not None:
            return find()
        time.sleep(0.01)
    return None


def _wait_listening(port: int, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
