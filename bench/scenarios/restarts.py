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

from bench.launchers import LocalJob, torchrun_argv, xrun_argv, xrun_supports
from bench.scenarios import elastic
from bench.scenarios.base import Context, restart_table, unavailable

NAME = "restarts"
TITLE = "12. Whole-job restart latency: N ranks, rank 1 fails once, one restart"
VARIANTS = ("xrun:static", "xrun:elastic", "torchrun")
TABLE = restart_table("next attempt running", references=["torchrun", "xrun:elastic"])


def run(ctx: Context) -> dict[str, Any]:
    if not xrun_supports("--min_attempt_s"):
        return unavailable(NAME, TITLE, "xrun restarts only elastic jobs (no --min_attempt_s in `xrun --help`)")
    return elastic.run_restarts(ctx, NAME, TITLE, VARIANTS, TABLE, restart_argv)


def restart_argv(variant: str, job: LocalJob) -> list[str]:
    if variant == "xrun:static":
        argv = xrun_argv(job)
        return [argv[0], "--max_restarts", "1", *argv[1:]]
    if variant == "torchrun":
        argv = torchrun_argv(job)
        return [*argv[:4], "--max-restarts", "1", *argv[4:]]
    return elastic.elastic_argv(variant, job)
