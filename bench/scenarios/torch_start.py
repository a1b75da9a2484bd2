"""Scenario 2: realistic start. N ranks that import torch, join a gloo group and do one all-reduce."""

from __future__ import annotations

from typing import Any

from bench.scenarios.base import Context
from bench.scenarios.launch import measure_local_start

NAME = "torch_start"
TITLE = "2. Realistic start: N ranks import torch + gloo init + 1 all-reduce"


def run(ctx: Context) -> dict[str, Any]:
    ns = ctx.option("nproc", (2,), (1, 2, 4, 8))
    return measure_local_start(
        ctx, NAME, TITLE, script="torch_allreduce.py", ns=ns, rounds=ctx.rounds(1, 3), deadline_s=180.0, torch=True
    )
