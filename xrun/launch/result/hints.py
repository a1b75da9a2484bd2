"""The next step a failure report ends with, when a rank's stderr shows a failure with a known fix.

Today one: DeepSpeed's launcher convention passes ``--local_rank=N`` to every rank (xrun keeps it as the default),
and a script whose parser does not declare it dies at once: argparse and hydra say ``unrecognized arguments:
--local_rank=0``, LightningCLI (jsonargparse) ``Unrecognized arguments``, click ``No such option: --local_rank``
(issue 13). Pure: lines in, a hint or None out; the node report (xrun.launch.report) and the head's
(xrun.runner.jobreport) both use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_REJECTS_LOCAL_RANK = r"(unrecognized arguments|no such option)\b.*--local[_-]rank"  # compiled on first use
LOCAL_RANK_FIX = (
    "the script does not accept --local_rank (argparse, hydra, LightningCLI, click): rerun with --no_local_rank "
    "(the rank is in the LOCAL_RANK variable)"
)


def failure_hint(stderr_tail: Iterable[str]) -> str | None:
    """The fix for what a failed rank's stderr tail shows, or None."""
    if any(re.search(_REJECTS_LOCAL_RANK, line, re.IGNORECASE) for line in stderr_tail):
        return LOCAL_RANK_FIX
    return None
