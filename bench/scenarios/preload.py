"""Scenario 14 (issue 32, opt-in): ranks forked from a preloaded helper. N torch ranks (import torch, a gloo group,
one all-reduce: bench/ranks/torch_allreduce.py) under ``xrun --preload torch`` (``xrun:preload``: one helper per
node imports torch once and every rank is forked from it), against the same job under plain ``xrun``, torchrun,
and the floor (bash starting them), paired in one run.

Three groups, paired rounds:
* ``start``: launch to exit (``wall_s``), ratios to the floor; goal: ``xrun:preload`` ≤ 0.6× the floor.
  ``floor:sessions`` starts each rank in a session of its own, as xrun does: where the kernel shares the CPU among
  sessions (autogroup), the plain floor's ranks share one slice of a busy machine and come out slower; the goal
  is judged against ``floor:sessions``, the fair one.
* ``memory``: the node's total PSS (ranks and helper; shared pages split among their sharers) once every rank is
  through its all-reduce, the ranks then holding for ``hold_s``.
* ``restart``: rank 3 fails after the first attempt's all-reduce, one restart (``--max_restarts 1``): from its
  exit until every rank of the next attempt is back through an all-reduce (``restart_s``), and to exit; goal ≤ 1 s.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench import harness, procs
from bench.launchers import LocalJob, floor_argv, torchrun_argv, xrun_argv
from bench.scenarios.base import Context, finish, median, section, target
from bench.scenarios.elastic import _read_float

NAME = "preload"
TITLE = "14. Preload: N torch ranks forked from a helper that imported torch once (xrun --preload torch)"
HELPER = "xrun.launch.preload.helper"  # in the helper's command line
PRELOADED = "xrun:preload"
TABLE = {
    "metrics": [["wall_s", "launch→exit", "s"], ["total_pss_mib", "ranks+helper PSS", "MiB"],
                ["restart_s", "failure→all back through a collective", "s"]],
    "ratio": "wall_s",
    "extra_ratio": "restart_s",
    "references": ["floor:sessions", "floor", "xrun", "torchrun"],
}


def launcher_argv(variant: str, job: LocalJob, *, restarts: int = 0) -> list[str]:
    if variant.startswith("floor"):
        return floor_argv(job, own_sessions=variant == "floor:sessions")
    if variant == "torchrun":
        torchrun, *rest = torchrun_argv(job)
        return [torchrun, *("--max-restarts", str(restarts)) * bool(restarts), *rest]
    flags = ("--max_restarts", str(restarts)) * bool(restarts) + ("--preload", "torch") * (variant == PRELOADED)
    return xrun_argv(LocalJob(job.nproc, job.script, job.args, job.master_port, xrun_flags=flags))


def run(ctx: Context) -> dict[str, Any]:
    n = ctx.option("nproc", 4, 4)
    rounds = ctx.rounds(1, 5)
    hold = ctx.option("hold_s", 1.0, 2.0)
    params = {"nproc": n, "rounds": rounds, "hold_s": hold, "script": "torch_allreduce.py"}
    sec = section(NAME, TITLE, params=params, skipped={}, table=TABLE, groups=[], targets=[])
    refs = TABLE["references"]

    start = harness.run_rounds(("floor", "floor:sessions", "xrun", PRELOADED, "torchrun"), rounds,
                               lambda v: _start(v, n), rng=ctx.rng, label=f"{NAME} start")
    sec["groups"].append({"label": f"start N={n}", "params": {"nproc": n},
                          **harness.summarize_group(start, references=refs)})
    memory = harness.run_rounds(("floor:sessions", "xrun", PRELOADED), rounds, lambda v: _memory(v, n, hold),
                                rng=ctx.rng, label=f"{NAME} memory")
    sec["groups"].append({"label": f"memory N={n}", "params": {"nproc": n},
                          **harness.summarize_group(memory, references=refs)})
    restart = harness.run_rounds(("xrun", PRELOADED, "torchrun"), rounds, lambda v: _restart(v, n), rng=ctx.rng,
                                 label=f"{NAME} restart")
    sec["groups"].append({"label": f"restart N={n}", "params": {"nproc": n},
                          **harness.summarize_group(restart, references=refs)})
    start_group, memory_group, restart_group = sec["groups"]
    sec["targets"] += [
        target(f"xrun --preload torch / floor (own sessions), start N={n}",
               median(start_group, PRELOADED, "wall_s", "floor:sessions"), 0.6, "×"),
        target(f"xrun --preload torch, failure → every rank back through a collective, N={n}",
               median(restart_group, PRELOADED, "restart_s"), 1.0, "s"),
        target(f"xrun --preload torch / floor, ranks+helper PSS, N={n}",
               median(memory_group, PRELOADED, "total_pss_mib", "floor:sessions"), 1.0, "×"),
    ]
    return finish(sec)


def _job(n: int, run: harness.RunDir, *args: str) -> tuple[str, LocalJob]:
    tag = procs.new_tag()
    job = LocalJob(nproc=n, script=harness.rank_script("torch_allreduce.py"),
                   args=harness.rank_args(tag, run, args), master_port=harness.free_port())
    return tag, job


def _start(variant: str, n: int) -> harness.Trial:
    with harness.RunDir() as run:
        tag, job = _job(n, run)
        got = harness.run_command(launcher_argv(variant, job), tag, run, deadline_s=180.0)
        trial = harness.Trial(metrics={"wall_s": got.wall_s, "last_rank_s": got.last_rank_s,
                                       "leftovers": float(len(got.leftovers))}, exit_code=got.exit_code)
        if got.exit_code != 0 or run.count("ok") != n or got.leftovers:
            trial.error = f"exit {got.exit_code}, {run.count('ok')} of {n} all-reduced | console: {run.tail(300)!r}"
        return trial


def _memory(variant: str, n: int, hold: float) -> harness.Trial:
    """The summed PSS of the ranks (and the helper) once all of them are through the all-reduce."""
    with harness.RunDir() as run:
        tag, job = _job(n, run, f"hold={hold}")
        proc = harness.start(launcher_argv(variant, job), env=harness.bench_env(tag), console=run.console)
        pss: int | None = None
        with harness.leave_nothing(proc, tag):
            deadline = time.monotonic() + 180.0
            while run.count("ok") < n and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if run.count("ok") == n:
                helpers = [p for p in procs.tagged_pids(tag) if HELPER in procs.cmdline(p, 400)]
                pss = sum(procs.pss_kib(p) or 0 for p in [*procs.rank_pids(run.path), *helpers])
            proc.wait(timeout=180.0)
        trial = harness.Trial(metrics={"total_pss_mib": None if pss is None else pss / 1024}, exit_code=proc.returncode)
        if pss is None or proc.returncode != 0:
            trial.error = f"exit {proc.returncode}, {run.count('ok')} of {n} all-reduced | console: {run.tail(300)!r}"
        return trial


def _restart(variant: str, n: int) -> harness.Trial:
    with harness.RunDir() as run:
        tag, job = _job(n, run, f"fail_rank={n - 1}")
        got = harness.run_command(launcher_argv(variant, job, restarts=1), tag, run, deadline_s=240.0)
        fail_ts = _read_float(os.path.join(run.path, "fail_ts"))
        through = [_read_float(os.path.join(run.path, "ok", name)) for name in os.listdir(os.path.join(run.path, "ok"))]
        tail = run.tail(300)
    back = [t for t in through if t is not None]
    return harness.restart_timing(got, back, fail_ts, ranks=n, cause="failure seen" if fail_ts else "no failure",
                                  after="the restart", tail=tail)
