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
from bench.scenarios.base import Context, finish, restart_table, section, unavailable

NAME = "elastic"
TITLE = "9. Elastic restart latency: N ranks, rank 1 fails once, one restart"
VARIANTS = ("xrun:elastic", "torchrun")
TABLE = restart_table("new generation running", references=["torchrun", "xrun:elastic"])


def run(ctx: Context) -> dict[str, Any]:
    if not (xrun_supports("--elastic") and xrun_supports("--max_restarts")):
        return unavailable(NAME, TITLE, "xrun has no elastic mode (no --elastic/--max_restarts in `xrun --help`)")
    return run_restarts(ctx, NAME, TITLE, VARIANTS, TABLE, elastic_argv)


def run_restarts(
    ctx: Context,
    name: str,
    title: str,
    variants: tuple[str, ...],
    table: dict[str, Any],
    argv: Callable[[str, LocalJob], list[str]],
) -> dict[str, Any]:
    """Scenarios 9 and 12: rounds of ``restart_trial`` over the variants, ``argv`` rendering each one's command."""
    n = ctx.option("nproc", 2, 4)
    rounds = ctx.rounds(1, 3)
    wanted = [v for v in variants if ctx.launchers is None or v.split(":")[0] in ctx.launchers]
    picked, skipped = ctx.pick(wanted)
    params = {"nproc": n, "fail_rank": 1, "fail_after_s": 1.0, "max_restarts": 1, "rounds": rounds}
    sec = section(name, title, params=params, skipped=skipped, table=table, groups=[], targets=[])

    def trial(variant: str) -> harness.Trial:
        return restart_trial(variant, n, argv=argv)

    results = harness.run_rounds(picked, rounds, trial, rng=ctx.rng, label=name)
    group = harness.summarize_group(results, references=table["references"])
    sec["groups"].append({"label": f"N={n}", "params": {"nproc": n}, **group})
    return finish(sec)


def elastic_argv(variant: str, job: LocalJob) -> list[str]:
    if variant == "torchrun":
        argv = torchrun_argv(job)
        return [*argv[:4], "--max-restarts", "1", *argv[4:]]
    argv = xrun_argv(job)
    return [argv[0], "--elastic", "--max_restarts", "1", *argv[1:]]


def restart_trial(variant: str, n: int, *, argv: Callable[[str, LocalJob], list[str]] = elastic_argv) -> harness.Trial:
    """One run of ``variant``; ``argv`` renders its command (scenario 12 passes its own)."""
    with harness.RunDir() as run:
        tag = procs.new_tag()
        args = harness.rank_args(tag, run, ("fail_rank=1", "fail_after=1", "code=7", "sleep=60"))
        job = LocalJob(nproc=n, script=harness.rank_script("elastic_rank.py"), args=args,
                       master_port=harness.free_port())  # fmt: skip
        got = harness.run_command(argv(variant, job), tag, run, deadline_s=120.0)
        restarted = harness.generations(run.path).get(1, [])
        fail_ts = _read_float(os.path.join(run.path, "fail_ts"))
        tail = run.tail(300)
    seen = "seen" if fail_ts else "never seen"
    return harness.restart_timing(got, restarted, fail_ts, ranks=n, cause=f"failure {seen}",
                                  after="a successful restart", tail=tail)  # fmt: skip


def _read_float(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None
