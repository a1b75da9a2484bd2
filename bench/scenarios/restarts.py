"""Scenario 12 (issue 23, opt-in): whole-job restart latency. N local ranks, one restart allowed; in the first
attempt rank 1 exits 7 after 1 s, the next attempt exits 0 at once (the same rank script as scenario 9).

Measured from the failing rank's exit timestamp until every rank of attempt 1 runs (their own start timestamps,
``TORCHELASTIC_RESTART_COUNT`` = 1), and until the launcher exits. xrun ``--max_restarts 1`` (a static job: xrun
stops every rank and starts the whole job again) against ``xrun --elastic --max_restarts 1`` and
``torchrun --standalone --max-restarts 1`` (torch's elastic agent restarts the worker group). ``xrun:pod`` is the
same job in pod mode: two xrun processes, one per "node" (127.0.0.1 and 127.0.0.2, N/2 ranks each), started at once
as a platform starts its pods; node 0 restarts every node's ranks in place, and the launcher's exit is both nodes'.
No torch in the ranks: the launchers' reaction and restart time only. Across nodes (the namespace cluster), see
tests/cluster/test_restarts.py, which prints the same figure for an ssh job.
"""

from __future__ import annotations

import shlex
from typing import Any

from bench import harness
from bench.launchers import LocalJob, torchrun_argv, xrun_argv, xrun_supports
from bench.scenarios import elastic
from bench.scenarios.base import Context, restart_table, unavailable

NAME = "restarts"
TITLE = "12. Whole-job restart latency: N ranks, rank 1 fails once, one restart"
VARIANTS = ("xrun:static", "xrun:pod", "xrun:elastic", "torchrun")
POD_TOKEN = "bench-pod-restarts-0123456789"  # noqa: S105 - a throwaway secret between two local xrun processes
TABLE = restart_table("next attempt running", references=["torchrun", "xrun:elastic"])


def run(ctx: Context) -> dict[str, Any]:
    if not xrun_supports("--min_attempt_s"):
        return unavailable(NAME, TITLE, "xrun restarts only elastic jobs (no --min_attempt_s in `xrun --help`)")
    return elastic.run_restarts(ctx, NAME, TITLE, VARIANTS, TABLE, restart_argv)


def restart_argv(variant: str, job: LocalJob) -> list[str]:
    if variant == "xrun:static":
        argv = xrun_argv(job)
        return [argv[0], "--max_restarts", "1", *argv[1:]]
    if variant == "xrun:pod":
        return pod_argv(job)
    if variant == "torchrun":
        argv = torchrun_argv(job)
        return [*argv[:4], "--max-restarts", "1", *argv[4:]]
    return elastic.elastic_argv(variant, job)


def pod_argv(job: LocalJob) -> list[str]:
    """Both pods of a two-node pod-mode job in one shell: node 1 in the background, node 0 in front; exits with
    node 0's code once node 1 has exited too."""
    control_port = harness.free_port()

    def pod(node_rank: int) -> str:
        return shlex.join(["xrun", "--pod", "--hosts", "127.0.0.1,127.0.0.2", "--node_rank", str(node_rank),
                           "--num_gpus", str(max(1, job.nproc // 2)), "--master_port", str(job.master_port),
                           "--control_port", str(control_port), "--max_restarts", "1", job.script, *job.args])

    script = f"export XRUN_TOKEN={POD_TOKEN}; {pod(1)} & {pod(0)}; code=$?; wait; exit $code"
    return ["sh", "-c", script]
