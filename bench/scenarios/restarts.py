"""Scenario 12 (issue 23, opt-in): whole-job restart latency. N local ranks, one restart allowed; in the first
attempt rank 1 exits 7 after 1 s, the next attempt exits 0 at once (the same rank script as scenario 9).

Measured from the failing rank's exit timestamp until every rank of attempt 1 runs (their own start timestamps,
``TORCHELASTIC_RESTART_COUNT`` = 1), and until the launcher exits. xrun ``--max_restarts 1`` (a static job: xrun
stops every rank and starts the whole job again) against ``xrun --elastic --max_restarts 1`` and
``torchrun --standalone --max-restarts 1`` (torch's elastic agent restarts the worker group). No torch in the
ranks: the launchers' reaction and restart time only. Across nodes (the namespace cluster), see
tests/cluster/test_restarts.py, which prints the same figure for an ssh job.
"""

from __future__ import annotations

from typing import Any

from bench import harness
from bench.launchers import LocalJob, torchrun_argv, xrun_argv, xrun_supports
from bench.scenarios import elastic
from bench.scenarios.base import Context, finish, section, unavailable

NAME = "restarts"
TITLE = "12. Whole-job restart latency: N ranks, rank 1 fails once, one restart"
VARIANTS = ("xrun:static", "xrun:elastic", "torchrun")
TABLE = {
    "metrics": [["restart_s", "next attempt running", "s"], ["exit_s", "launcher exit", "s"]],
    "ratio": "restart_s",
    "references": ["torchrun", "xrun:elastic"],
    "extra_ratio": "exit_s",
}


def run(ctx: Context) -> dict[str, Any]:
    if not xrun_supports("--min_attempt_s"):
        return unavailable(NAME, TITLE, "xrun restarts only elastic jobs (no --min_attempt_s in `xrun --help`)")
    n = ctx.option("nproc", 2, 4)
    rounds = ctx.rounds(1, 3)
    wanted = [v for v in VARIANTS if ctx.launchers is None or v.split(":")[0] in ctx.launchers]
    variants, skipped = ctx.pick(wanted)
    params = {"nproc": n, "fail_rank": 1, "fail_after_s": 1.0, "max_restarts": 1, "rounds": rounds}
    sec = section(NAME, TITLE, params=params, skipped=skipped, table=TABLE, groups=[], targets=[])

    def trial(variant: str) -> harness.Trial:
        return elastic.restart_trial(variant, n, argv=restart_argv)

    results = harness.run_rounds(variants, rounds, trial, rng=ctx.rng, label=NAME)
    group = harness.summarize_group(results, references=TABLE["references"])
    sec["groups"].append({"label": f"N={n}", "params": {"nproc": n}, **group})
    return finish(sec)


def restart_argv(variant: str, job: LocalJob) -> list[str]:
    if variant == "xrun:static":
        argv = xrun_argv(job)
        return [argv[0], "--max_restarts", "1", *argv[1:]]
    if variant == "torchrun":
        argv = torchrun_argv(job)
        return [*argv[:4], "--max-restarts", "1", *argv[4:]]
    return elastic.elastic_argv(variant, job)
