"""``xrun report DIR`` (a run in progress, or one that died) and the head's ``write_report`` at a run's end."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from xrun.common.output.logfiles import REPORT_HTML
from xrun.common.output.status import say
from xrun.common.result.failure_report import write_atomically
from xrun.errors import RecordError, UsageError, XrunError
from xrun.printable import one_line
from xrun.runner.report.model import report_of
from xrun.runner.report.page import render
from xrun.runner.report.record import read_run

PLOTLY_JS = "plotly-basic.min.js"
USAGE = "usage: xrun report DIR (a run's --log_dir): writes DIR/report.html from DIR/events.jsonl (docs/report.md)"


def main(args: Sequence[str]) -> int:
    if list(args) in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        if len(args) != 1 or args[0].startswith("-"):
            raise UsageError("xrun report", f"give one directory, a run's --log_dir ({USAGE})")
        path = report(args[0])
    except XrunError as err:
        print(f"xrun: {one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    print(path)
    return 0


def report(log_dir: str) -> str:
    """Write ``log_dir``'s report.html from its record; its path."""
    run = read_run(log_dir)
    page = render(report_of(run.lines, summary=run.summary, failure=run.failure, torn=run.torn), plotly_js())
    path = os.path.join(log_dir, REPORT_HTML)
    try:
        write_atomically(path, page)  # as summary.json: a browser reloading it never sees half a page
    except OSError as err:
        raise RecordError(path, None, f"cannot write it: {err.strerror or err}") from None
    return path


def write_report(log_dir: str) -> None:
    """The head's, at the end of a run with ``--log_dir``: the page, or one line saying why not (the job's end and
    its exit code stand)."""
    try:
        report(log_dir)
    except XrunError as err:
        say(f"no {REPORT_HTML}: {one_line(str(err))}")


def plotly_js() -> str:
    """plotly.js's basic bundle (bar and scatter traces, all the page draws), vendored beside this module with its
    MIT licence: plotly.js-basic-dist-min 4.1.1 from npm (docs/report.md says why and how to update it)."""
    with open(os.path.join(os.path.dirname(__file__), "vendor", PLOTLY_JS), encoding="utf-8") as f:
        return f.read()
