"""Scenario 9: elastic restart latency. N local ranks under an elastic agent with one restart allowed; in the
first generation rank 1 exits 7 after 1 s, the next generation exits 0 at once.

Measured from the failing rank's exit timestamp: until every rank of the new generation is running (their own
start timestamps, ``TORCHELASTIC_RESTART_COUNT`` = 1), and until the launcher exits (code 0 expected). No torch
in the ranks, so this is the agents' reaction and restart time only. xrun ``--elastic`` against
``torchrun --standalone --max-restarts 1``; both use torch's elastic agent, xrun with a 0.1 s monitor interval
(torchrun's default in torch ≥ 2.4 too).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from bench import harness, procs
from bench.launchers import LocalJob, torchrun_argv, xrun_argv, xrun_supports
from bench.scenarios.base import Context, finish, section, unavailable

NAME = "elastic"
TITLE = "9. Elastic restart latency: N ranks, rank 1 fails once, one restart"
VARIANTS = ("xrun:elastic", "torchrun")
TABLE = {
    "metrics": [["restart_s", "new generation running", "s"], ["exit_s", "launcher exit", "s"]],
    "ratio": "restart_s",
    "references": ["torchrun", "xrun:elastic"],
    "extra_ratio": "exit_s",
}


def run(ctx: Context) -> dict[str, Any]:
    if not (xrun_supports("--elastic") and xrun_supports("--max_restarts")):
        return unavailable(NAME, TITLE, "xrun has no elastic mode (no --elastic/--max_restarts in `xrun --help`)")
    n = ctx.option("nproc", 2, 4)
    rounds = ctx.rounds(1, 3)
    wanted = [v for v in VARIANTS if ctx.launchers is None or v.split(":")[0] in ctx.launchers]
    variants, skipped = ctx.pick(wanted)
    params = {"nproc": n, "fail_rank": 1, "fail_after_s": 1.0, "max_restarts": 1, "rounds": rounds}
    sec = section(NAME, TITLE, params=params, skipped=skipped, table=TABLE, groups=[], targets=[])

    def trial(variant: str) -> harness.Trial:
        return restart_trial(variant, n)

    results = harness.run_rounds(variants, rounds, trial, rng=ctx.rng, label=NAME)
    group = harness.summarize_group(results, references=TABLE["references"])
    sec["groups"].append({"label": f"N={n}", "params": {"nproc": n}, **group})
    return finish(sec)


def elastic_argv(variant: str, job: LocalJob) -> list[str]:
    if variant == "torchrun":
        argv = torchrun_argv(job)
        return [*argv[:4], "--max-restarts", "1", *argv[4:]]
    argv = xrun_argv(job)
    return [argv[0], "--elastic", "--max_restarts", "1", *argv[1:]]


def restart_trial(variant: str, n: int, *, argv: Callable[[str, LocalJob], list[str]] | None = None) -> harness.Trial:
    """One run of ``variant``; ``argv`` renders its command (scenario 12 passes its own)."""
    with harness.RunDir() as run:
        tag = procs.new_tag()
        args = harness.rank_args(tag, run, ("fail_rank=1", "fail_after=1", "code=7", "sleep=60"))
        job = LocalJob(nproc=n, script=harness.rank_script("elastic_rank.py"), args=args,
                       master_port=harness.free_port())  # fmt: skip
        got = harness.run_command((argv or elastic_argv)(variant, job), tag, run, deadline_s=120.0)
        generations = _generations(run.path)
        fail_ts = _read_float(os.path.join(run.path, "fail_ts"))
        tail = run.tail(300)
    restarted = generations.get(1, [])
    trial = harness.Trial(exit_code=got.exit_code, notes={"leftovers": got.leftovers} if got.leftovers else {})
    if fail_ts is None or len(restarted) != n:
        trial.error = f"{len(restarted)} of {n} ranks restarted, failure {'seen' if fail_ts else 'never seen'}"
        trial.error += f", exit {got.exit_code} | console: {tail!r}"
        return trial
    trial.metrics = {
        "restart_s": max(restarted) - fail_ts,
        "exit_s": None if got.wall_s is None else got.started_at + got.wall_s - fail_ts,
        "leftovers": float(len(got.leftovers)),
    }
    if got.exit_code != 0:
        trial.error = f"exit {got.exit_code} after a successful restart | console: {tail!r}"
    return trial


def _generations(run_dir: str) -> dict[int, list[float]]:
    """Start times by restart count, from the ranks' pid files ("start rank restart_count")."""
    out: dict[int, list[float]] = {}
    ranks = os.path.join(run_dir, "ranks")
    for name in os.listdir(ranks):
        with open(os.path.join(ranks, name)) as f:
            words = f.read().split()
        if len(words) == 3:
            out.setdefault(int(words[2]), []).append(float(words[0]))
    return out


def _read_float(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None
