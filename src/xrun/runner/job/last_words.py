"""The runner's last words: the job's verdict as the lines printed on stderr when the run ends.

``job failed: <root cause> (exit code N); every node stopped X s later`` (the code only where the cause did not
say it) and the failing rank's last output lines (and the fix, when xrun.launch.result.hints knows one), or
``stopped by SIGINT (exit code 130)``; after either, with ``--max_restarts``, why the restarts ended and each
attempt's root cause; before either, how many connections were turned away for not presenting
the run's token. A job that succeeded says nothing.
"""

from __future__ import annotations

import re

from xrun.launch.procs.posix import signal_name
from xrun.launch.result.hints import failure_hint
from xrun.runner.job.events import Verdict

TAIL_SHOWN = 10  # of the failing rank's last output lines


def _exit_code(reason: str, code: int) -> str:
    """`` (exit code N)``, unless the root cause already said that code (each fact once: issue 17)."""
    return "" if re.search(rf"\bcode {code}\b", reason) else f" (exit code {code})"


def headline(verdict: Verdict) -> str | None:
    """The verdict's first line: the signal that stopped the job, or its root cause; None for a job that succeeded.
    Pod mode's node 0 sends it with the verdict, and every other node prints it (``server.verdict_message``)."""
    failure, code = verdict.failure, verdict.exit_code
    if verdict.interrupted_by is not None:
        return f"stopped by {signal_name(verdict.interrupted_by)} (exit code {code})"
    if failure is None:
        return None
    stopped = "" if verdict.stopped_after is None else f"; every node stopped {verdict.stopped_after:.2f} s later"
    return f"job failed: {failure.reason}{_exit_code(failure.reason, code)}{stopped}"


def report_lines(verdict: Verdict, *, strays: int = 0) -> list[str]:
    lines = []
    if strays:
        lines.append(f"closed {strays} connection(s) that did not prove this run's key")
    first, failure = headline(verdict), verdict.failure
    if first is not None:
        lines.append(first)
    if verdict.interrupted_by is None and failure is not None:
        lines += [f"  [{failure.host}:{failure.rank}] {line}" for line in failure.tail[-TAIL_SHOWN:]]
        hint = failure_hint(failure.exit_code, failure.tail)
        if hint:
            lines.append(hint)
    return lines + list(verdict.restart_lines)  # --max_restarts: why they ended, each attempt's root cause
