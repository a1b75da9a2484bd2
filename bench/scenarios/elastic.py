"""Scenario 9: elastic restart latency against torchrun — only once xrun has an elastic mode.

Until then this scenario reports "not available" and measures nothing.
"""

from __future__ import annotations

from typing import Any

from bench.launchers import xrun_supports
from bench.scenarios.base import Context, unavailable

NAME = "elastic"
TITLE = "9. Elastic restart latency vs torchrun"


def run(ctx: Context) -> dict[str, Any]:
    if not (xrun_supports("--max_restarts") or xrun_supports("--elastic")):
        return unavailable(NAME, TITLE, "xrun has no elastic mode yet (no --max_restarts/--elastic in `xrun --help`)")
    return unavailable(NAME, TITLE, "xrun grew an elastic mode; this scenario is not written yet")
