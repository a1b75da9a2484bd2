"""Scenario 13 (issue 23, opt-in): a lost node replaced by a hot spare. 3 namespace nodes of 1 slot: node1 and node2
run the job, node3 stands by (``--spares 1 --max_restarts 1``); once both ranks of the first attempt run, node2 is
killed (SIGKILL to every process of its namespace, its sshd too); the next attempt runs on node1 and node3.

Measured from just before the kill until every rank of attempt 1 runs (their own start timestamps,
``TORCHELASTIC_RESTART_COUNT`` = 1: the spare's rank included), and until the launcher exits (the ranks of attempt 1
exit 0 at once). Issue 23's bound: the teardown plus one rank start plus 1 s. No torch in the ranks: the launcher's
reaction and replacement only. The remote interpreter is a wrapper that puts this checkout's ``src`` first on
PYTHONPATH, so the agents are this tree's (``bench/ranks/elastic_rank.py`` is the rank: no rank fails, attempt 0
sleeps).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from bench import cluster, harness, procs
from bench.launchers import xrun_supports
from bench.scenarios.base import Context, finish, median, restart_table, section, unavailable

NAME = "spares"
TITLE = "13. Hot spare: 2 nodes and a spare, node2 killed mid-run, the next attempt on the spare"
VARIANTS = ("xrun:ssh", "xrun:pdsh")
TABLE = restart_table("next attempt running", references=["xrun:ssh"])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = os.path.join(ROOT, "src")  # this checkout's xrun, ahead of an installed one


def run(ctx: Context) -> dict[str, Any]:
    if not xrun_supports("--spares"):
        return unavailable(NAME, TITLE, "xrun has no hot spares (no --spares in `xrun --help`)")
    rounds = ctx.rounds(1, 3)
    backends = cluster.xrun_backends()
    variants = [v for v in VARIANTS if v.split(":")[1] in backends]
    params = {"nodes": 2, "spares": 1, "killed": "node2", "rounds": rounds}
    sec = section(NAME, TITLE, params=params, skipped={}, table=TABLE, groups=[], targets=[])
    try:
        with cluster.cluster(3, busy_timeout_s=ctx.option("busy_timeout_s", 20.0, 300.0),
                             state=ctx.options.get("cluster_state")) as c:  # fmt: skip
            with harness.RunDir() as files:
                hostfile = str(c.hostfile(os.path.join(files.path, "hostfile"), slots=1,
                                          nodes=cluster.node_names(3)))  # fmt: skip
                python = _python_wrapper(files.path)
                results = harness.run_rounds(variants, rounds, lambda v: _trial(c, v, hostfile, python),
                                             rng=ctx.rng, label=NAME)  # fmt: skip
    except cluster.Unavailable as why:
        return unavailable(NAME, TITLE, str(why))
    group = harness.summarize_group(results, references=TABLE["references"])
    sec["groups"].append({"label": "2 nodes + 1 spare", "params": {"nodes": 2}, **group})
    for variant in variants:
        value = median(sec["groups"][-1], variant, "restart_s")
        sec["targets"].append({
            "what": f"{variant}: kill -> every rank of the next attempt running, on the spare (bound: teardown + one "
                    "rank start + 1 s)",
            "value": value,
            "met": value is not None and value < 1.5,
            "shown": "?" if value is None else f"{value:.3f} s",
        })  # fmt: skip
    return finish(sec)


def _python_wrapper(directory: str) -> str:
    path = os.path.join(directory, "python")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nPYTHONPATH={SOURCES}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    os.chmod(path, 0o755)
    return path


def _trial(c: Any, variant: str, hostfile: str, python: str) -> harness.Trial:
    backend = variant.split(":")[1]
    with harness.RunDir() as run:
        tag = procs.new_tag()
        args = harness.rank_args(tag, run, ("fail_rank=-1", "sleep=60"))
        argv = [sys.executable, "-m", "xrun", "-H", hostfile, "--launcher", backend, "--python", python,
                "--max_restarts", "1", "--spares", "1", "--master_port", "0", "--shutdown_timeout", "5"]
        if backend == "ssh":  # paramiko reads no ssh_config.d drop-in
            argv += ["--ssh_config", str(c.ssh_config)]
        killed: list[float] = []
        threading.Thread(target=_kill_when_running, args=(c, run.path, killed), daemon=True).start()
        got = harness.run_command([*argv, harness.rank_script("elastic_rank.py"), *args], tag, run, deadline_s=120.0,
                                  env_extra={"PYTHONPATH": SOURCES})  # fmt: skip
        restarted = harness.generations(run.path).get(1, [])
        tail = run.tail(300)
    return harness.restart_timing(got, restarted, killed[0] if killed else None, ranks=2,
                                  cause=f"node2 {'killed' if killed else 'never killed'}", after="the replacement",
                                  tail=tail)  # fmt: skip


def _kill_when_running(c: Any, run_dir: str, killed: list[float], timeout: float = 60.0) -> None:
    """Once both ranks of attempt 0 run, kill node2 (after its sshd comes back up for the next trial)."""
    deadline = time.monotonic() + timeout
    while len(harness.generations(run_dir).get(0, [])) < 2:
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)
    killed.append(time.time())
    c.kill_node("node2")
    c.ensure_healthy(kill_strays=False)  # node2's sshd again, for the next round
