"""A node's result as a failure report: a few lines for a human on stderr, the same data as JSON for tools.

The first rank that failed on its own is the root cause; ranks xrun stopped because of it are listed as
consequences, so the line to read at 3 a.m. is the first one; it says so when the root cause aborted in its
teardown after its last line (xrun.common.result.hints). The exception the root cause recorded with torch's
``@record`` (type, message, innermost frames) comes before its stderr tail, which may end in atexit noise; a
failure with a known fix (xrun.common.result.hints) ends the report with it.
Every rank's figures (xrun.common.result.summary: wall, CPU, peak RSS, status) follow as a table, then the other ranks'
stacks taken before the stop, merged (xrun.common.result.stackview), when the hang doctor took them, and what
their collective records say (xrun.common.result.collectiveview: the collective they wait in, who never entered
it, mismatches; ``failure.json``'s ``"collectives"``).
``conclude`` is the end of every node agent run, static or elastic: the report and
``{log_dir}/{host}/failure.json`` when something went wrong, else the one success line (only where this node is
the whole job: with a head, the head says it for every node); ``{log_dir}/{host}/summary.json`` either way;
then the exit code.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

from xrun.common.output.logfiles import FAILURE_JSON, SUMMARY_JSON, host_log_dir
from xrun.common.output.streams import notice
from xrun.common.output.writer import writer
from xrun.common.procs.posix import signal_name
from xrun.common.result.errorfile import error_lines
from xrun.common.result.group_restart import restarted_words
from xrun.common.result.hints import IN_TEARDOWN, aborted_in_teardown, failure_hint
from xrun.common.result.outcome import NodeResult, RankOutcome, describe_status, exit_code_of
from xrun.common.result.summary import RankFigures, lost_before, success_line, summary_json, table_lines
from xrun.printable import each_line, one_line

_SHOWN_CONSEQUENCES = 16  # ranks listed by name before "... and N more"


def conclude(result: NodeResult, log_dir: str | None, *, announce: bool = True) -> int:
    """Report a node's result where something went wrong (a root cause or a stop signal), or its success line
    (``announce``: this node is the whole job); write its summary under ``log_dir``; return its exit code."""
    figures = [RankFigures.of(o) for o in result.outcomes]
    if result.root_cause is not None or result.interrupted_by is not None or result.hang is not None:
        writer().drain()  # the node's queued lines and notices first (the console is written from a thread)
        sys.stderr.write(each_line(format_failure_report(result)) + "\n")  # tails, stacks: escaped (issue 22)
        if log_dir is not None:
            write_failure_json(os.path.join(host_log_dir(log_dir, result.host), FAILURE_JSON), result)
    elif announce and result.exit_code == 0 and figures:
        notice(result.host, success_line(figures, result.lost, dict(result.group_restarts)))
    if log_dir is not None:
        write_json(os.path.join(host_log_dir(log_dir, result.host), SUMMARY_JSON),
                   summary_json(figures, exit_code=result.exit_code, lost=result.lost))
    return result.exit_code


def format_failure_report(result: NodeResult) -> str:
    """The report for stderr: what happened on this node, the root cause first, then its stderr tail."""
    root = result.root_cause
    restarted = restarted_words(dict(result.group_restarts))  # --replica_groups: the groups restarted before it
    lines = [f"xrun: node {result.host}: {_headline(result)}{_exit_code(result)}{'; ' if restarted else ''}{restarted}"]
    ordered = ([root] if root else []) + [o for o in result.outcomes if o is not root and _notable(o)]
    shown = ordered[: _SHOWN_CONSEQUENCES + 1]
    for outcome in shown:
        lines.append(_rank_line(outcome, outcome is root))
    if len(ordered) > len(shown):
        lines.append(f"  ... and {len(ordered) - len(shown)} more ranks")
    ok = sum(1 for o in result.outcomes if not _notable(o))
    if ok:
        lines.append(f"  {ok} rank{'s' if ok != 1 else ''} exited with code 0")
    lines.extend(table_lines([RankFigures.of(o) for o in result.outcomes]))
    lines.extend(_taken_before_the_stop(result)[0])
    if root is not None:
        if root.error is not None:
            lines.extend(f"  {line}" for line in error_lines(root.rank, root.error))
        lines.extend(_tail_lines(root))
    hint = next((h for o in ordered if o.failed for h in (failure_hint(exit_code_of(o), o.stderr_tail),) if h), None)
    if hint:
        lines.append(f"xrun: node {result.host}: {hint}")
    return "\n".join(lines)


def failure_json(result: NodeResult) -> dict[str, Any]:
    """The same facts as the report, as JSON-able data (one entry per rank, in rank order)."""
    root = result.root_cause
    return {
        "host": result.host,
        "exit_code": result.exit_code,
        "interrupted_by": _signal_json(result.interrupted_by),
        "root_cause": root.rank if root is not None else None,
        "ranks": [_outcome_json(o, o is root) for o in result.outcomes],
        "hang": result.hang,
        "stacks": [s.to_json() for s in result.stacks],
        # the ranks' collective records taken before the stop (xrun.common.telemetry.records; null: not read),
        # and what they say compared (xrun.common.result.collectiveview)
        "collectives": None if result.collectives is None else {
            "ranks": [c.to_json() for c in result.collectives.collectives], "file": result.collectives.file,
            "torchfrtrace": result.collectives.folder,  # the same dumps for torch's analyser (telemetry.frtrace)
            "findings": _taken_before_the_stop(result)[1]},
    }


def _taken_before_the_stop(result: NodeResult) -> tuple[list[str], dict[str, Any] | None]:
    """What the hang doctor took before the stop: the report's lines (the ranks' stacks merged, outliers first;
    what their collective records say compared, and where the full records are) and the records' findings for
    ``failure.json`` (None: no records were read)."""
    if not result.stacks and result.collectives is None:
        return [], None
    # Lazy (issue 38): the merged view and the comparison are 5 ms of python -X importtime where the doctor's dumps
    # are loaded, 13 ms with the records and stacks they load where not (median of 11); only a result the hang doctor
    # took something for needs them, and the doctor that took it has loaded the rest.
    from xrun.common.result import collectiveview, stackview

    lines = []
    if result.stacks:
        lines.append(f"  stacks of {len(result.stacks)} rank(s) taken before the stop, outliers first:")
        lines.extend(f"    {line}" for line in stackview.render(stackview.merge(result.stacks)))
    if result.collectives is None:
        return lines, None
    findings = collectiveview.find_hang(result.collectives.collectives)
    lines.extend(f"  {line}" for line in collectiveview.view_lines(findings))
    lines.append(f"  {result.collectives.line()}")
    return lines, findings.to_json()


def write_failure_json(path: str, result: NodeResult) -> None:
    """Write ``failure_json(result)`` to ``path`` atomically (a reader never sees half a file)."""
    write_json(path, failure_json(result))


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically, making its directory (a reader never sees half a file).

    A file that cannot be written (the log disk full, the directory gone or read-only since the preflight) is
    one line on stderr: the job's end and its exit code stand (it was a traceback and exit 1, even for a job
    whose every rank succeeded)."""
    try:
        _write_json(path, data)
    except OSError as err:
        sys.stderr.write(f"xrun: cannot write {one_line(path)}: {err.strerror or err}\n")


def _write_json(path: str, data: Any) -> None:
    write_atomically(path, json.dumps(data, indent=2) + "\n")


def write_atomically(path: str, text: str) -> None:
    """``text`` to ``path`` through a new file of a random name in its directory (made if missing), renamed over it:
    a reader never sees half a file, and a link planted at ``path`` is replaced, never written through (mkstemp's
    O_EXCL; 0600). OSError when it cannot be written."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------------------------------------------------------


def _headline(result: NodeResult) -> str:
    if result.hang is not None:
        return f"stopped as hung: {result.hang}"
    root = result.root_cause
    if root is not None:
        teardown = f", {IN_TEARDOWN}" if aborted_in_teardown(exit_code_of(root), root.stderr_tail) else ""
        return (f"rank {root.rank} {_failed(result, root)}: {describe_status(root)} after {root.runtime_s:.2f} s"
                f"{teardown}{lost_before(result.lost)}")
    if result.interrupted_by is not None:
        return f"stopped by {signal_name(result.interrupted_by)}"
    failed = sum(1 for o in result.outcomes if o.failed)
    if failed:
        return f"{failed} rank{'s' if failed != 1 else ''} failed"
    leftovers = sum(len(o.leftovers) for o in result.outcomes)
    if leftovers:
        return f"all ranks exited with code 0; {leftovers} leftover process(es) had to be stopped"
    return "all ranks exited with code 0"


def _failed(result: NodeResult, root: RankOutcome) -> str:
    """Where the root cause stands among the other ranks' ends: ``failed last`` (--on_rank_exit keep: the ranks lost
    before it ran on), ``failed first`` (the others were stopped, or failed after it), or ``failed`` (the others
    had ended well)."""
    if result.lost:
        return "failed last"
    others = [o for o in result.outcomes if o.rank != root.rank]
    return "failed first" if any(o.failed or o.stopped_by_xrun for o in others) else "failed"


def _exit_code(result: NodeResult) -> str:
    """`` (exit code N)``, unless the headline already said it (each fact once: issue 17)."""
    root = result.root_cause
    if root is not None and root.signal is None and root.returncode == result.exit_code:
        return ""
    return f" (exit code {result.exit_code})"


def _notable(outcome: RankOutcome) -> bool:
    return outcome.failed or bool(outcome.leftovers)


def _rank_line(outcome: RankOutcome, is_root: bool) -> str:
    mark = "root cause" if is_root else ("stopped" if outcome.stopped_by_xrun else "failed" if outcome.failed else "")
    pid = f"pid {outcome.pid}" if outcome.pid else "pid -"
    text = (
        f"  {mark:<10}  rank {outcome.rank} (local {outcome.local_rank}, {pid})  "
        f"{describe_status(outcome)}  {outcome.runtime_s:.2f} s"
    )
    if outcome.leftovers:
        text += f"  leftovers stopped: {', '.join(str(p) for p in outcome.leftovers)}"
    return text


def _tail_lines(outcome: RankOutcome) -> list[str]:
    if not outcome.stderr_tail:
        return [f"  rank {outcome.rank} wrote nothing to stderr"]
    lines = [f"  last {len(outcome.stderr_tail)} line(s) of rank {outcome.rank}'s stderr:"]
    lines.extend(f"    | {line}" for line in outcome.stderr_tail)
    return lines


def _signal_json(signum: int | None) -> dict[str, Any] | None:
    return None if signum is None else {"number": signum, "name": signal_name(signum)}


def _outcome_json(outcome: RankOutcome, is_root: bool) -> dict[str, Any]:
    return {
        "host": outcome.host,
        "rank": outcome.rank,
        "local_rank": outcome.local_rank,
        "pid": outcome.pid,
        "exit_code": outcome.returncode,
        "signal": _signal_json(outcome.signal),
        "status": describe_status(outcome),
        "failed": outcome.failed,
        "root_cause": is_root,
        "stopped_by_xrun": outcome.stopped_by_xrun,
        "runtime_s": round(outcome.runtime_s, 6),
        "cpu_s": None if outcome.cpu_s is None else round(outcome.cpu_s, 6),
        "peak_rss_bytes": outcome.peak_rss_bytes,
        "leftovers": list(outcome.leftovers),
        "stderr_tail": list(outcome.stderr_tail),
        "error": outcome.error.to_json() if outcome.error is not None else None,
    }
