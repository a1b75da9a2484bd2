"""Scenario 1: launch overhead. N local no-op ranks (no torch), launch to exit, against the floor.

Also records when the first and the last rank started (from the ranks' own clocks), which shows where a slow
launcher spends its time: before the ranks (imports, rendezvous) or after them (polling, shutdown).
"""

from __future__ import annotations

from typing import Any

from bench import harness
from bench.launchers import LAUNCHERS, LocalJob
from bench.scenarios.base import Context, finish, median, section, target

NAME = "launch"
TITLE = "1. Launch overhead: N no-op ranks, launch to exit"
VARIANTS = ("floor", "pyfloor", "xrun", "torchrun", "deepspeed")
TABLE = {
    "metrics": [["wall_s", "launch→exit", "s"], ["last_rank_s", "last rank up", "s"]],
    "ratio": "wall_s",
    "reference": "floor",
}


def run(ctx: Context) -> dict[str, Any]:
    ns = ctx.option("nproc", (1, 2), (1, 2, 4, 8))
    return measure_local_start(
        ctx, NAME, TITLE, script="noop.py", ns=ns, rounds=ctx.rounds(1, 5), deadline_s=90.0, torch=False
    )


def measure_local_start(
    ctx: Context,
    name: str,
    title: str,
    *,
    script: str,
    ns: tuple[int, ...],
    rounds: int,
    deadline_s: float,
    torch: bool,
) -> dict[str, Any]:
    variants, skipped = ctx.pick(VARIANTS if not torch else tuple(v for v in VARIANTS if v != "pyfloor"))
    sec = section(
        name,
        title,
        params={"nproc": list(ns), "rounds": rounds, "script": script},
        skipped=skipped,
        table=TABLE,
        groups=[],
        targets=[],
    )
    for n in ns:

        def trial(variant: str, n: int = n) -> harness.Trial:
            with harness.RunDir() as run:
                job = LocalJob(nproc=n, script=harness.rank_script(script), args=(), master_port=harness.free_port())
                got = harness.run_local_job(LAUNCHERS[variant], job, run, deadline_s=deadline_s)
                return local_trial(got, n, run, need_ok=torch)

        results = harness.run_rounds(variants, rounds, trial, rng=ctx.rng, label=f"{name} N={n}")
        sec["groups"].append({"label": f"N={n}", "params": {"nproc": n}, **harness.summarize_group(results)})
    if not torch:
        for group in sec["groups"]:
            sec["targets"].append(
                target(f"xrun / floor, {group['label']}", median(group, "xrun", "wall_s", "floor"), 2.0, "×")
            )
    return finish(sec)


def local_trial(got: harness.JobRun, n: int, run: harness.RunDir, *, need_ok: bool) -> harness.Trial:
    """Turn one observed run into metrics, and say what went wrong (a wrong rank count is not a timing)."""
    trial = harness.Trial(
        metrics={
            "wall_s": got.wall_s,
            "first_rank_s": got.first_rank_s,
            "last_rank_s": got.last_rank_s,
            "leftovers": float(len(got.leftovers)),
        },
        exit_code=got.exit_code,
    )
    problems = []
    if got.wall_s is None:
        problems.append("killed at the deadline")
    elif got.exit_code != 0:
        problems.append(f"exit code {got.exit_code}")
    if got.ranks_started != n:
        problems.append(f"{got.ranks_started} of {n} ranks started")
    if need_ok and run.count("ok") != n:
        problems.append(f"{run.count('ok')} of {n} ranks finished the all-reduce")
    if got.leftovers:
        problems.append(f"leftovers: {got.leftovers}")
    if problems:
        trial.error = "; ".join(problems) + (f" | console: {run.tail(300)!r}" if got.exit_code else "")
    return trial
