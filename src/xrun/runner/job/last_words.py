"""The runner's last words: the job's verdict as the lines printed on stderr when the run ends.

``job failed: <root cause> (exit code N); every node stopped X s later`` (the code only where the cause did not
say it; ``, then stopped by SIGINT while stopping every node`` after the cause where a signal came once the stop
had begun) and the failing rank's last output lines (and the fix, when xrun.common.result.hints knows one), or
``stopped by SIGINT (exit code 130)``; after either, with ``--max_restarts``, why the restarts ended and each
attempt's root cause; before either, how many connections were turned away for not presenting
the run's token; under ``--on_rank_exit keep``, the ranks lost before the failure. A job that succeeded says
nothing. ``verdict_json``: the same facts for ``summary.json``.
"""

from __future__ import annotations

import re
from typing import Any

from xrun.common.procs.posix import signal_name
from xrun.common.result.hints import failure_hint
from xrun.common.result.summary import lost_before
from xrun.runner.job.events import Verdict

TAIL_SHOWN = 10  # of the failing rank's last output lines


def _exit_code(reason: str, code: int) -> str:
    """`` (exit code N)``, unless the root cause already said that code (each fact once: issue 17)."""
    return "" if re.search(rf"\bcode {code}\b", reason) else f" (exit code {code})"


def headline(verdict: Verdict) -> str | None:
    """The verdict's first line: the signal that stopped the job, or its root cause; None for a job that succeeded.
    Pod mode's node 0 sends it with the verdict, and every other node prints it (``server.verdict_message``)."""
    failure, code, signum = verdict.failure, verdict.exit_code, verdict.interrupted_by
    if failure is None:
        return None if signum is None else f"stopped by {signal_name(signum)} (exit code {code})"
    # a failure beside a signal came first (RootCause records none after one): the signal only hurried the stop
    then = "" if signum is None else f", then stopped by {signal_name(signum)} while stopping every node"
    stopped = "" if verdict.stopped_after is None else f"; every node stopped {verdict.stopped_after:.2f} s later"
    lost = lost_before(verdict.lost_ranks)  # --on_rank_exit keep
    return f"job failed: {failure.reason}{_exit_code(failure.reason, code)}{then}{stopped}{lost}"


def report_lines(verdict: Verdict, *, strays: int = 0) -> list[str]:
    lines = []
    if strays:
        lines.append(f"closed {strays} connection(s) that did not prove this run's key")
    first, failure = headline(verdict), verdict.failure
    if first is not None:
        lines.append(first)
    if failure is not None:
        lines += [f"  [{failure.host}:{failure.rank}] {line}" for line in failure.tail[-TAIL_SHOWN:]]
        hint = failure_hint(failure.exit_code, failure.tail)
        if hint:
            lines.append(hint)
    return lines + list(verdict.restart_lines)  # --max_restarts: why they ended, each attempt's root cause


def verdict_json(verdict: Verdict) -> dict[str, Any]:
    """``summary.json``'s account of the end: the end line, the root cause and the signal that stopped the job
    (both where the signal came while xrun was already stopping the job for the root cause)."""
    failure, signum = verdict.failure, verdict.interrupted_by
    return {
        "end": headline(verdict),
        "root_cause": None if failure is None else {
            "reason": failure.reason, "host": failure.host, "rank": failure.rank, "exit_code": failure.exit_code},
        "interrupted_by": None if signum is None else {"number": signum, "name": signal_name(signum)},
    }
