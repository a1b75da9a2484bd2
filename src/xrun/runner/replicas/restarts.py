"""The replica groups' restarts as the head hears them (``group_restarted``, one per restart, from the node that
decided it: xrun.launch.replicas.supervision): a line of ``events.jsonl`` each and, in ``summary.json``,
``group_restarts`` (docs/replica-groups.md). A group's restart after a rank's end is its node's when the group lies
within one node; the head decides the restart of a group across nodes (xrun.runner.replicas.spans) and the move of
a lost node's groups to a hot spare (xrun.runner.replicas.moves), recorded here alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from xrun.common.result.group_restart import GroupRestart
from xrun.runner.replicas.moves import GroupMove


class GroupRestarts:
    def __init__(self) -> None:
        self.heard: list[dict[str, Any]] = []  # the record's lines, in the order they came

    def add(self, host: str, restart: GroupRestart, *, hosts: tuple[str, ...] = ()) -> dict[str, Any]:
        """A group's restart on ``host``: a node's ``group_restarted`` (``GroupRestart.from_json``), the head's
        move of a lost node's groups to a hot spare (``moved``), or the head's restart of a group across nodes
        (the failed rank's ``host``; ``hosts``: every node of the group, xrun.runner.replicas.spans); the record's
        line for it."""
        line = {"host": host, **({"hosts": list(hosts)} if hosts else {}), **restart.to_json()}
        self.heard.append(line)
        return line

    def moved(self, lost: str, spare: str, reason: str, moves: Iterable[GroupMove], *, budget: int, at: float
              ) -> list[dict[str, Any]]:
        """The head moved the groups of the node ``lost`` (``reason``) to the hot spare ``spare`` (at ``at``, the
        wall clock): one restart each, on the spare (its first rank there stands for the group)."""
        cause = f"was lost with its node {lost} ({reason}); the hot spare {spare} took its place"
        return [self.add(spare, GroupRestart(group=move.group, restart=move.restart, budget=budget, rank=move.rank,
                                             cause=cause, at=at, others=()))
                for move in moves]

    def to_json(self) -> list[dict[str, Any]]:
        return list(self.heard)
