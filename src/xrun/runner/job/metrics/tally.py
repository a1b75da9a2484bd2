"""What the metrics count that the job's machine keeps no count of, folded over the record's lines as the record
makes them (``xrun.runner.job.record.head.JobRecord``'s folds; the lines: docs/events.md). Pure: lines in, numbers
out; the exporter reads them when Prometheus scrapes.

Each label's values are fixed here (``STATES``, ``RANK_STATES``, ``CAUSES``): a job's series stay a handful
whatever happens to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xrun.common.result.outcome import HANG_EXIT

# the job's state, by the last line that moved it
STATES = ("starting", "running", "stopping", "restarting", "ended")
_STATE_OF = {"job_started": "starting", "attempt_started": "running", "stop_requested": "stopping",
             "job_ended": "ended"}
RANK_STATES = ("waiting", "running", "succeeded", "failed", "stopped")
# a restart's cause, in three words: a rank failed (its exit code or signal), every rank hung (--hang_action
# restart), or a node-level cause (its agent lost, a failed preflight)
CAUSES = ("rank", "hang", "node")
COUNTED = ("node_joined", "node_lost", "spare_swapped")  # events the metrics count as they come


def cause_of(line: Mapping[str, Any]) -> str:
    """The cause of an ``attempt_ended`` (or ``failure``) line's failure."""
    if line.get("rank") is not None:
        return "rank"
    return "hang" if line.get("exit_code") == HANG_EXIT else "node"


class RecordTally:
    """The fold. ``ranks_by_node``: how many ranks each node rank runs (the plan's), to count a node's started
    ranks from its one ``node_started`` line."""

    def __init__(self, ranks_by_node: Sequence[int]) -> None:
        self.ranks_by_node = tuple(ranks_by_node)
        self.world_size = sum(self.ranks_by_node)
        self.state = "starting"
        self.attempt = 0
        self.restarts = dict.fromkeys(CAUSES, 0)
        self.counted = dict.fromkeys(COUNTED, 0)  # how many of these lines so far
        self._started = 0  # this attempt's ranks told to start (their node said so)
        self._ended = dict.fromkeys(RANK_STATES[2:], 0)  # this attempt's ranks over, by how

    def add(self, line: Mapping[str, Any]) -> None:
        event = line.get("event")
        state = _STATE_OF.get(str(event))
        if state is not None and self.state != "ended":
            self.state = state
        if event == "attempt_started":
            self.attempt = int(line["attempt"])
            self._started = 0
            self._ended = dict.fromkeys(self._ended, 0)
        elif event == "node_started" and line.get("attempt") == self.attempt:
            node = line.get("node")
            if isinstance(node, int) and 0 <= node < len(self.ranks_by_node):
                self._started += self.ranks_by_node[node]
        elif event == "rank_exited" and line.get("attempt") == self.attempt:
            how = "stopped" if line.get("stopped") else "succeeded" if line.get("code") == 0 else "failed"
            self._ended[how] += 1
        elif event == "attempt_ended" and line.get("ending") == "restart":
            self.restarts[cause_of(line)] += 1
            if self.state != "ended":
                self.state = "restarting"
        elif event in self.counted:
            self.counted[str(event)] += 1

    def ranks(self) -> dict[str, int]:
        """This attempt's ranks by state: every rank in one (``waiting``: its node has not started it)."""
        ended = dict(self._ended)
        started = min(self._started, self.world_size)
        running = max(0, started - sum(ended.values()))
        return {"waiting": self.world_size - started, "running": running, **ended}
