"""The replica groups' restarts as the head hears them (``group_restarted``, one per restart, from the node that
decided it: xrun.launch.replicas.supervision): a line of ``events.jsonl`` each and, in ``summary.json``,
``group_restarts`` (docs/replica-groups.md). A group's restart after a rank's end is its node's; the head decides
only the move of a lost node's groups to a hot spare (xrun.runner.replicas.moves), recorded here alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from xrun.common.result.group_restart import GroupRestart
from xrun.runner.replicas.moves import GroupMove


class GroupRestarts:
    def __init__(self) -> None:
        self.heard: list[tuple[str, GroupRestart]] = []  # (host, restart), in the order they came

    def add(self, host: str, restart: GroupRestart) -> dict[str, Any]:
        """A group's restart on ``host``: a node's ``group_restarted`` (``GroupRestart.from_json``), or the head's
        move of a lost node's groups to a hot spare (``moved``); the record's line for it."""
        self.heard.append((host, restart))
        return {"host": host, **restart.to_json()}

    def moved(self, lost: str, spare: str, reason: str, moves: Iterable[GroupMove], *, budget: int, at: float
              ) -> list[dict[str, Any]]:
        """The head moved the groups of the node ``lost`` (``reason``) to the hot spare ``spare`` (at ``at``, the
        wall clock): one restart each, on the spare (its first rank there stands for the group)."""
        cause = f"was lost with its node {lost} ({reason}); the hot spare {spare} took its place"
        return [self.add(spare, GroupRestart(group=move.group, restart=move.restart, budget=budget, rank=move.rank,
                                             cause=cause, at=at, others=()))
                for move in moves]

    def to_json(self) -> list[dict[str, Any]]:
        return [{"host": host, **restart.to_json()} for host, restart in self.heard]
