"""A peer's strings reach the console with their control characters escaped (issue 22 §6).

A joined agent or pod-mode node sends host names, versions, error messages, tails and stacks; printed raw, a
``\\x1b]...`` in one of them would rewrite the user's terminal (its title, its screen, a hyperlink). Every
line xrun prints of its own goes through ``xrun.printable.one_line`` at the printing edge; only the ranks' own
output passes through as it is.
"""

from __future__ import annotations

from xrun import __version__
from xrun.common.output.status import PlainStatus, say, waiting_line
from xrun.common.output.streams import notice
from xrun.common.result.failure_report import conclude
from xrun.common.result.outcome import NodeResult, RankOutcome
from xrun.common.result.summary import RankFigures, table_lines
from xrun.printable import each_line, one_line
from xrun.runner.check import HostReport, format_host_table
from xrun.runner.job.events import AgentError, Done, HelloReceived, RankExited, Ready
from xrun.runner.job.last_words import report_lines
from xrun.runner.job.machine import Job, JobConfig

EVIL = "x\x1b]0;pwned\x07\x1b[2J\r\x9b1m"  # a title, a cleared screen, a carriage return, a C1 CSI
SHOWN = "x\\x1b]0;pwned\\x07\\x1b[2J\\r\\x9b1m"


def control_free(text: str) -> bool:
    return not any(ord(c) < 0x20 and c != "\n" or 0x7f <= ord(c) <= 0x9f for c in text)


def test_one_line_and_each_line_escape_every_control_character():
    assert one_line(EVIL) == SHOWN
    assert each_line(f"{EVIL}\nok ✓\ttab") == f"{SHOWN}\nok ✓\\ttab"  # line breaks kept, unicode untouched


def test_the_runners_lines_show_a_peers_escapes(capsys):
    say(f"lost node {EVIL}: connection closed")
    PlainStatus(2).waiting(1, [EVIL], 10.5)
    assert capsys.readouterr().err == f"xrun: lost node {SHOWN}: connection closed\n" \
                                      f"xrun: 1/2 nodes ready; waiting for {SHOWN} (10 s)\n"
    assert waiting_line(1, 2, [EVIL], 3) == f"1/2 nodes ready; waiting for {SHOWN} (3 s)"


def test_a_peers_version_error_and_tail_through_the_job_to_the_console(capsys):
    # What an agent sends in its hello, its error and its rank's tail, as the control server hands them over.
    job = Job(JobConfig(hosts=("a", "b"), join_timeout=30.0, shutdown_timeout=10.0, world_size=2), now=0.0)
    status = PlainStatus(2)
    actions = []
    for event in (HelloReceived(0, 0, addr="10.0.0.1", peer="10.9.9.1", xrun_version=__version__),
                  HelloReceived(1, 1, addr="10.0.0.2", peer="10.9.9.2", xrun_version=f"9{EVIL}"),
                  Ready(0, 29500), Ready(1),
                  RankExited(1, rank=1, local_rank=0, code=3, tail=(f"tail {EVIL}",)),
                  AgentError(0, f"error {EVIL}"), Done(0, 1), Done(1, 3)):
        actions += job.handle(event, 1.0)
    for action in actions:
        if type(action).__name__ == "ShowLine":
            status.line(action.text)
    for line in report_lines(job.verdict()):
        say(line)
    err = capsys.readouterr().err
    assert f"b runs xrun 9{SHOWN}, this is {__version__}" in err
    assert f"[b:1] tail {SHOWN}" in err
    assert control_free(err), err


def test_an_agents_notice_and_report_escape_what_came_from_the_channel(capfd):
    # A stop's reason comes from the head (or node 0 in pod mode); the report quotes tails and host names.
    notice("h", f"{EVIL}: SIGTERM to 1 rank(s)")
    outcome = RankOutcome(host=f"h{EVIL}", rank=0, local_rank=0, pid=1, returncode=3, signal=None, runtime_s=1.0,
                          stderr_tail=(f"boom {EVIL}",), stopped_by_xrun=False)
    conclude(NodeResult(host=f"h{EVIL}", outcomes=(outcome,), root_cause=outcome, interrupted_by=None, exit_code=3),
             None)
    err = capfd.readouterr().err
    assert err.startswith(f"xrun[h]: {SHOWN}: SIGTERM to 1 rank(s)\n")
    assert f"boom {SHOWN}" in err and f"node h{SHOWN}" in err
    assert control_free(err), err


def test_tables_of_peers_answers_are_escaped():
    figures = [RankFigures(rank=0, local_rank=0, host=f"h{EVIL}", wall_s=1.0, cpu_s=None, peak_rss_bytes=None,
                           status=f"exit {EVIL}", ok=False)]
    assert all(control_free(line) for line in table_lines(figures))
    report = HostReport(host="h", slots=(0,), reachable=True, facts={"python": f"/usr/bin/python{EVIL}"})
    assert control_free(format_host_table([report], 0)) and SHOWN in format_host_table([report], 0)
