"""What a failed rank's exit code and stderr tail tell beyond its status: a failure with a known fix, and an abort
in teardown. Pure: a code and lines in, a hint or None out; the node report (xrun.common.result.failure_report) and
the head's (xrun.runner.job.last_words, xrun.runner.job.verdict) both use it.

* DeepSpeed's launcher convention passes ``--local_rank=N`` to every rank (xrun keeps it as the default), and a
  script whose parser does not declare it dies at once: argparse and hydra say ``unrecognized arguments:
  --local_rank=0``, LightningCLI (jsonargparse) ``Unrecognized arguments``, click ``No such option: --local_rank``
  (issue 13).
* A rank killed by SIGABRT (134) whose stderr ends with libstdc++'s ``terminate called without an active
  exception`` and holds no Python traceback printed its last line and then aborted as its process ended: a C++
  thread still running while the interpreter tore itself down. torch 2.13's gloo does this now and then after the
  script's work, under torchrun as under xrun (issue 33 §5; docs/compatibility.md). The root-cause line says so.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

_REJECTS_LOCAL_RANK = r"(unrecognized arguments|no such option)\b.*--local[_-]rank"  # compiled on first use
LOCAL_RANK_FIX = (
    "the script does not accept --local_rank (argparse, hydra, LightningCLI, click): rerun with --no_local_rank "
    "(the rank is in the LOCAL_RANK variable)"
)
TERMINATE_LINE = "terminate called without an active exception"  # libstdc++'s, just before it calls abort()
ABORT_EXIT = 128 + signal.SIGABRT  # 134: how the shell, and xrun's exit code, show a SIGABRT
IN_TEARDOWN = "in its teardown, after its last line"  # the root-cause line's words for ``aborted_in_teardown``
TEARDOWN_FIX = (
    f"the rank aborted after its last line ('{TERMINATE_LINE}'): a C++ thread still running as the process ended, "
    "as torch's gloo does now and then under torchrun too. End the script with "
    "torch.distributed.destroy_process_group(); where something still holds the group (transformers' Trainer), "
    "flush and leave with os._exit(0) (docs/compatibility.md#an-abort-at-exit-gloo)"
)


def aborted_in_teardown(exit_code: int, stderr_tail: Sequence[str]) -> bool:
    """SIGABRT (134), with a tail that ends with libstdc++'s terminate line (it aborts right after printing it; a
    progress bar's line may have had no end of its own) and holds no Python traceback: the rank printed its last
    line, then aborted in teardown."""
    lines = [line.strip() for line in stderr_tail if line.strip()]
    return (
        exit_code == ABORT_EXIT
        and bool(lines)
        and lines[-1].endswith(TERMINATE_LINE)
        and not any("Traceback (most recent call last)" in line for line in lines)
    )


def failure_hint(exit_code: int, stderr_tail: Sequence[str]) -> str | None:
    """The fix for what a failed rank's exit code (the shell's convention: 128 + a signal) and stderr tail show,
    or None."""
    if any(re.search(_REJECTS_LOCAL_RANK, line, re.IGNORECASE) for line in stderr_tail):
        return LOCAL_RANK_FIX
    if aborted_in_teardown(exit_code, stderr_tail):
        return TEARDOWN_FIX
    return None
