"""Opt-in scenario: ``xrun check --network`` on 4, 8, 16 and 32 namespace nodes (issue 24), and what ``--precheck``
adds to a job.

Measured: the wall time of the whole check (ssh start of every node's probe, two rounds of pairs, the report)
and whether every node came out ok; a job of one no-op rank per node over ``--launcher ssh``, without
(``xrun:job``) and with ``--precheck`` (``xrun:precheck``): its wall time, and the precheck's own time as its
``precheck passed ... in S s`` line says (the check over the job's agents, from the barrier to the start).
The rounds run their pairs in parallel, so the time should stay nearly flat
as the node count doubles (docs/network-check.md has the model); on this 2-core machine every probe shares the
same CPUs, so the throughput figures fall with the count while the time does not grow with the square of it.
The remote interpreter is a wrapper that puts this checkout's ``src`` first on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

from bench import cluster, harness
from bench.scenarios.base import Context, finish, median, section, target, unavailable

NAME = "network_check"
TITLE = "11. xrun check --network: time of the pairwise check by node count"
TABLE = {"metrics": [["check_s", "whole check", "s"], ["job_s", "whole job", "s"],
                     ["precheck_s", "its precheck", "s"]], "ratio": "check_s", "references": []}
PASSED = re.compile(r"precheck passed: \d+ node\(s\) ok in ([0-9.]+) s")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = os.path.join(ROOT, "src")  # this checkout's xrun, ahead of an installed one


def _wrapper(path: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\nPYTHONPATH={SOURCES} exec {sys.executable} "$@"\n')
    os.chmod(path, 0o755)
    return path


def _trial(c: Any, hostfile: str, python: str) -> harness.Trial:
    argv = [sys.executable, "-m", "xrun", "check", "--network", "--json", "-H", hostfile, "--python", python,
            "--ssh_config", str(c.ssh_config)]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=SOURCES))
    elapsed = time.monotonic() - start
    try:
        nodes = json.loads(done.stdout)["nodes"]
    except (ValueError, KeyError):
        return harness.Trial(metrics={"check_s": elapsed}, exit_code=done.returncode, error=done.stderr[-300:])
    rates = sorted(n["throughput_mbs"] or 0.0 for n in nodes)
    return harness.Trial(metrics={"check_s": elapsed}, exit_code=done.returncode,
                         notes={"bad": [n["host"] for n in nodes if n["verdict"] != "ok"],
                                "median_mbs": rates[len(rates) // 2]})


def _job_trial(c: Any, hostfile: str, python: str, precheck: bool) -> harness.Trial:
    run_dir = os.path.dirname(hostfile)  # noop.py records each rank under RUN_DIR/ranks
    os.makedirs(os.path.join(run_dir, "ranks"), exist_ok=True)
    argv = [sys.executable, "-m", "xrun", "-H", hostfile, "--launcher", "ssh", "--python", python,
            "--ssh_config", str(c.ssh_config), *(["--precheck"] if precheck else []), harness.rank_script("noop.py"),
            f"dir={run_dir}"]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=SOURCES))
    metrics: dict[str, float | None] = {"job_s": time.monotonic() - start}
    if precheck:
        found = PASSED.search(done.stderr)
        metrics["precheck_s"] = float(found.group(1)) if found else None
    return harness.Trial(metrics=metrics, exit_code=done.returncode,
                         error=done.stderr[-300:] if done.returncode else "")


def _trial_of(variant: str, c: Any, hostfile: str, python: str) -> harness.Trial:
    if variant == "xrun:check":
        return _trial(c, hostfile, python)
    return _job_trial(c, hostfile, python, precheck=variant == "xrun:precheck")


def run(ctx: Context) -> dict[str, Any]:
    counts = ctx.option("nodes", (4, 8), (4, 8, 16, 32))
    rounds = ctx.rounds(1, 3)
    sec = section(NAME, TITLE, params={"nodes": list(counts), "rounds": rounds}, skipped={}, table=TABLE,
                  groups=[], targets=[])
    try:
        for k in counts:
            with cluster.cluster(k, busy_timeout_s=ctx.option("busy_timeout_s", 20.0, 300.0)) as c, \
                    harness.RunDir() as files:
                hostfile = str(c.hostfile(os.path.join(files.path, "hostfile"), slots=1,
                                          nodes=cluster.node_names(k)))
                python = _wrapper(os.path.join(files.path, "python"))
                results = harness.run_rounds(["xrun:check", "xrun:job", "xrun:precheck"], rounds,
                                             lambda v, c=c, h=hostfile, p=python: _trial_of(v, c, h, p),
                                             rng=ctx.rng, label=f"{NAME} {k}")
            group = harness.summarize_group(results, references=())
            sec["groups"].append({"label": f"{k} nodes", "params": {"nodes": k}, **group})
    except cluster.Unavailable as why:
        return unavailable(NAME, TITLE, str(why))
    for group in sec["groups"]:
        if group["params"]["nodes"] <= 5:
            sec["targets"].append(target(f"{group['label']}: whole check", median(group, "xrun:check", "check_s"),
                                         30.0, "s"))
    return finish(sec)
