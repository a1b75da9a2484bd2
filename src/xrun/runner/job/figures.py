"""Every rank's figures at the head (``xrun.common.result.summary``): each agent sends its ranks' with their
``rank_exited``, and once the job is over the last attempt's are summed up as a node sums up its own ranks: one
line on success, the table after a failure, and ``summary.json`` (how the job ended: its end line, root cause and
stop signal; with the restart history, when there were attempts). The control server
(``xrun.runner.job.control_server``) registers ``JobFigures.reads`` for the ``rank_exited`` messages, and a restart
begins the figures anew (``begin_attempt``). Under ``--replica_groups`` it counts each group's restarts (the
nodes' ``group_restarted``: a group restarts within an attempt, its node decides it) for the success line.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from xrun.channel import Kind, Message, Reader
from xrun.common.output.status import say
from xrun.common.result.failure_report import write_json
from xrun.common.result.group_restart import GroupRestart
from xrun.common.result.summary import RankFigures, success_line, summary_json, table_lines
from xrun.runner.job.events import Verdict
from xrun.runner.job.last_words import verdict_json


class JobFigures:
    """The figures of every rank of one attempt, as the agents sent them."""

    def __init__(self) -> None:
        self.ranks: list[RankFigures] = []
        self.group_restarts: Counter[int] = Counter()  # --replica_groups: group -> its restarts, the whole run's

    def reads(self) -> dict[Kind, Reader]:
        return {Kind.RANK_EXITED: self._rank_exited, Kind.GROUP_RESTARTED: self._group_restarted}

    def begin_attempt(self) -> None:
        self.ranks = []  # the attempt before's are not this one's

    def _rank_exited(self, node: int, msg: Message, now: float) -> None:
        """One rank's figures from its ``rank_exited``; malformed ones raise ValueError (a protocol error)."""
        if msg.get("figures") is not None:
            self.ranks.append(RankFigures.from_json(msg["figures"]))

    def _group_restarted(self, node: int, msg: Message, now: float) -> None:
        """A malformed one raises ValueError (a protocol error)."""
        self.group_restarted(GroupRestart.from_json(dict(msg)).group)

    def group_restarted(self, group: int) -> None:
        """A node's restart of its group, or the head's of a group across nodes (xrun.runner.replicas.spans)."""
        self.group_restarts[group] += 1

    def sum_up(self, verdict: Verdict, *, log_dir: str | None, stragglers: Mapping[str, Any] | None = None,
               recorded: Mapping[str, Any] | None = None) -> None:
        """After the verdict: one line on success, the table on failure, the JSON under ``log_dir`` (with the
        ranks' straggler scores, xrun.common.result.stragglers, when any was scored, and the job record's goodput
        and figures, xrun.runner.job.record)."""
        if not self.ranks:
            return
        exit_code = verdict.exit_code
        if exit_code == 0:
            say(success_line(self.ranks, verdict.lost_ranks, self.group_restarts))
        else:
            sys.stderr.write("\n".join(table_lines(self.ranks)) + "\n")
        if log_dir is not None:
            write_job_summary(log_dir, self.ranks, verdict, stragglers, recorded)


def write_job_summary(log_dir: str, ranks: Sequence[RankFigures], verdict: Verdict,
                      stragglers: Mapping[str, Any] | None = None, recorded: Mapping[str, Any] | None = None) -> None:
    """``{log_dir}/summary.json``, the job's: every rank's figures, how the job ended, its attempts (with
    ``--max_restarts``), the ranks' straggler scores (when any was scored) and the record's ``goodput`` and
    ``events`` (docs/events.md). The local run's head writes it without the line (xrun.joined.one_node)."""
    data = {**summary_json(ranks, exit_code=verdict.exit_code, lost=verdict.lost_ranks), **verdict_json(verdict)}
    if verdict.attempts:
        data["attempts"] = [attempt.to_json() for attempt in verdict.attempts]
    if stragglers is not None and stragglers.get("ranks"):
        data["stragglers"] = dict(stragglers)
    if recorded is not None:
        data.update(recorded)
    write_json(os.path.join(log_dir, "summary.json"), data)
