"""Scenario 6: logging throughput. One rank writes 20 MB as 100-byte lines (one write per line) to stdout.

The launcher's console goes to a file (as when a job's output is redirected), and the bench checks every line
arrived. The floor is the same rank run directly with stdout to a file (and to /dev/null, the ceiling);
``floor:unbuffered`` runs it as xrun and deepspeed do (``python -u``: one write per line) to the file, and
``floor:unbuffered-devnull`` to /dev/null: the most any launcher that keeps output live that way can reach.
xrun runs with its per-line rank prefixes and ``--log_dir`` (console + one file per rank), the same with
``--no_dedupe`` (``xrun:nodedupe``: with ``--set nproc=2`` or more that is de-duplication's cost, every rank's
lines being its own, tagged with its rank, so each goes through the merger and none merges), and plain
(``--no_prefix``, no log dir); torchrun plain and with ``--log-dir --tee 3`` (its prefixed console + files).
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

from bench import harness
from bench.launchers import LAUNCHERS, LocalJob
from bench.scenarios.base import Context, finish, section

NAME = "logging"
TITLE = "6. Logging throughput: one rank writes 100-byte lines to stdout (20 MB in a full run)"
VARIANTS = (
    "floor",
    "floor:devnull",
    "floor:unbuffered",
    "floor:unbuffered-devnull",
    "xrun",
    "xrun:nodedupe",
    "xrun:plain",
    "torchrun",
    "torchrun:logdir",
    "deepspeed",
)
TABLE = {
    "metrics": [["wall_s", "launch→exit", "s"], ["mb_per_s", "MB/s from rank start", "MB/s"]],
    "ratio": "wall_s",
    "reference": "floor",
}


def run(ctx: Context) -> dict[str, Any]:
    size = ctx.option("bytes", 2_000_000, 20_000_000)
    n = ctx.option("nproc", 1, 1)
    rounds = ctx.rounds(1, 3)
    variants, skipped = ctx.pick(VARIANTS)
    sec = section(
        NAME,
        TITLE,
        params={"bytes": size, "line": 100, "nproc": n, "rounds": rounds},
        skipped=skipped,
        table=TABLE,
        groups=[],
        targets=[],
    )

    def trial(variant: str) -> harness.Trial:
        launcher, _, flavour = variant.partition(":")
        with harness.RunDir() as run:
            job = LocalJob(
                nproc=n,
                script=harness.rank_script("writer.py"),
                args=(f"bytes={size}", "line=100"),
                master_port=harness.free_port(),
                log_dir=os.path.join(run.path, "logs") if flavour in ("logdir", "nodedupe") or variant == "xrun"
                else None,
                prefix=flavour != "plain",
                dedupe=flavour != "nodedupe",
            )
            console = subprocess.DEVNULL if flavour.endswith("devnull") else None
            # floor:unbuffered = the rank as `python -u` (what xrun and deepspeed run), straight to the file
            env = {"PYTHONUNBUFFERED": "1"} if flavour.startswith("unbuffered") else None
            got = harness.run_local_job(LAUNCHERS[launcher], job, run, deadline_s=300.0, console=console, env_extra=env)
            lines = None if console is not None else _count(run.console)
            tail = run.tail(300) if got.exit_code else ""
        total = size * n
        trial = harness.Trial(
            metrics={"wall_s": got.wall_s, "mb_per_s": _rate(total, got), "leftovers": float(len(got.leftovers))},
            exit_code=got.exit_code,
        )
        expected = n * (size // 100)
        if got.exit_code != 0 or (lines is not None and lines != expected):
            trial.error = f"exit {got.exit_code}, {lines} of {expected} lines arrived"
            trial.error += f" | console: {tail!r}" if tail else ""
        return trial

    results = harness.run_rounds(variants, rounds, trial, rng=ctx.rng, label=NAME)
    sec["groups"].append(
        {
            "label": f"{size / 1e6:g} MB, N={n}",
            "params": {"bytes": size, "nproc": n},
            **harness.summarize_group(results),
        }
    )
    return finish(sec)


def _rate(total: int, got: harness.JobRun) -> float | None:
    """MB/s from the rank's start to the launcher's exit: the launcher's start-up cost is scenario 1's business."""
    if got.wall_s is None or got.first_rank_s is None or got.wall_s <= got.first_rank_s:
        return None
    return total / 1e6 / (got.wall_s - got.first_rank_s)


def _count(path: str) -> int:
    with open(path, "rb") as f:
        return f.read().count(b"XBLOG")
