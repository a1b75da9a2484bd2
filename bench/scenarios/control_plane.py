"""Scale scenario ``control_plane``: one real control server against N simulated agents (10,000 in a full run).

The head is ``python -m bench.control_server N``: xrun's ``ControlServer`` with the plan of an N-node world, no
backend behind it. The agents are ``bench.loadgen``: one process, one selector, no thread per agent, speaking the
channel protocol. A trial joins every agent (hello, spec, ready, start), lets the job run 2.5 s (one ping round),
then node 0's rank exits 7 and the server must stop every other node. Figures:

* ``barrier_s``: the last hello sent (after its TLS handshake and challenge) -> the last agent has its ``start``
  (target ≤ 1 s);
* ``join_s``: the server's start -> every agent started (connects throttled to 256 at a time);
* ``stop_s``: the failure reported -> the last agent has its ``stop`` (target ≤ 1 s);
* ``exit_s``: the failure reported -> the head process gone (exit code 7 expected);
* ``head_mib`` (VmHWM, target ≤ 200 MiB), ``head_threads`` (1: no thread per agent), ``head_cpu_s``;
* ``rx_b`` / ``tx_b``: channel bytes per node, head -> agent and agent -> head, over the whole job.

Knobs: ``agents`` (quick 1000, full 10000). Both processes raise their open-files soft limit to the hard one;
N above it (minus some slack) is reported as not available.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

from bench import harness
from bench.loadgen import LoadGen
from bench.scenarios.base import Context, finish, median, section, target, unavailable

NAME = "control_plane"
TITLE = "Scale B. Control plane: one control server, N simulated agents, a failure"
TABLE = {
    "metrics": [
        ["barrier_s", "last hello→all started", "s"],
        ["stop_s", "failure→all stopped", "s"],
        ["exit_s", "failure→head exit", "s"],
        ["join_s", "head up→all started", "s"],
        ["head_mib", "head peak RSS", "MiB"],
        ["head_threads", "head threads", ""],
        ["head_cpu_s", "head CPU", "s"],
        ["rx_b", "bytes to each agent", "B"],
        ["tx_b", "bytes from each agent", "B"],
    ],
    "references": [],
}
TOKEN = "c" * 64
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(ctx: Context) -> dict[str, Any]:
    agents = ctx.option("agents", 1000, 10000)
    rounds = ctx.rounds(1, 3)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and agents + 64 > hard:
        return unavailable(NAME, TITLE, f"{agents} agents need {agents + 64} open files; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sec = section(NAME, TITLE, params={"agents": agents, "rounds": rounds}, skipped={}, table=TABLE, groups=[],
                  targets=[])
    results = harness.run_rounds(["xrun"], rounds, lambda _v: trial(agents), rng=ctx.rng, label=NAME)
    group = {"label": f"{agents} agents", "params": {"agents": agents}, **harness.summarize_group(results)}
    sec["groups"].append(group)
    sec["targets"] += [
        target(f"barrier released after the last hello, {agents} agents", median(group, "xrun", "barrier_s"), 1.0, "s"),
        target(f"stop reaches every agent after a failure, {agents} agents", median(group, "xrun", "stop_s"), 1.0, "s"),
        target(f"head peak RSS, {agents} agents", median(group, "xrun", "head_mib"), 200.0, "MiB"),
        target("head threads (no thread per agent)", median(group, "xrun", "head_threads"), 1.0),
    ]
    return finish(sec)


def trial(agents: int) -> harness.Trial:
    with harness.RunDir() as run:
        stats_path = os.path.join(run.path, "stats.json")
        env = {**harness.bench_env("xbench-control"), "XBENCH_TOKEN": TOKEN}
        t0 = time.monotonic()
        with open(run.console, "wb") as console:
            head = subprocess.Popen([sys.executable, "-m", "bench.control_server", str(agents), stats_path],
                                    env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=console)
        try:
            return _drive(head, agents, t0, stats_path, run)
        finally:
            if head.poll() is None:
                head.kill()
                head.wait()


def _drive(head: subprocess.Popen[bytes], agents: int, t0: float, stats_path: str,
           run: harness.RunDir) -> harness.Trial:
    assert head.stdout is not None
    first = head.stdout.readline().split()
    if len(first) != 2:
        return harness.Trial(error=f"the head did not start | {run.tail(300)!r}")
    gen = LoadGen("127.0.0.1", int(first[0]), TOKEN, first[1].decode("ascii"), nodes=agents)
    try:
        gen.join(timeout=300)
        started = gen.last("start_at")
        gen.serve(2.5)
        threads = _threads(head.pid)
        gen.fail(node=0, code=7)
        gen.finish(timeout=120)
        head.wait(timeout=60)
        gone = time.monotonic()
    except (TimeoutError, subprocess.TimeoutExpired) as err:
        return harness.Trial(error=f"{err} | {run.tail(300)!r}")
    finally:
        gen.close()
    with open(stats_path) as f:
        stats = json.load(f)
    failed = gen.failed_at or gone
    metrics = {
        "barrier_s": _minus(started, gen.last("hello_at")), "stop_s": _minus(gen.last("stop_at", skip=0), failed),
        "exit_s": gone - failed, "join_s": _minus(started, t0), "head_mib": stats["vmhwm_kib"] / 1024,
        "head_threads": float(threads), "head_cpu_s": stats["cpu_s"],
        "rx_b": gen.bytes_in / agents, "tx_b": gen.bytes_out / agents,
    }
    error = "; ".join(gen.errors[:3]) or (None if stats["exit_code"] == 7 else f"head exit code {stats['exit_code']}")
    return harness.Trial(metrics=metrics, exit_code=stats["exit_code"], error=error)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
