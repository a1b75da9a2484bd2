"""The replica groups' restarts as the head hears them (``group_restarted``, one per restart, from the node that
decided it: xrun.launch.replicas.supervision): a line of ``events.jsonl`` each and, in ``summary.json``,
``group_restarts`` (docs/replica-groups.md). The head takes no decision on them: a group's restart is its node's."""

from __future__ import annotations

from typing import Any

from xrun.channel import Message
from xrun.common.result.group_restart import GroupRestart


class GroupRestarts:
    def __init__(self) -> None:
        self.heard: list[tuple[str, GroupRestart]] = []  # (host, restart), in the order they came

    def add(self, host: str, msg: Message) -> dict[str, Any]:
        """A node's ``group_restarted`` (a malformed one: ValueError); the record's line for it."""
        restart = GroupRestart.from_json(dict(msg))
        self.heard.append((host, restart))
        return {"host": host, **restart.to_json()}

    def to_json(self) -> list[dict[str, Any]]:
        return [{"host": host, **restart.to_json()} for host, restart in self.heard]
