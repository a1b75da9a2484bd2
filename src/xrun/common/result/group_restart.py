"""One replica group's restart as data (``--replica_groups``, issue 39 §2): which group, the how-many-th of its
budget, whose end caused it and when. The node's rank group decides it (xrun.launch.replicas.supervision), says it in
one line (``line``) and tells the head (a ``group_restarted`` message: ``to_json``), which keeps it for
``summary.json`` and ``events.jsonl`` (xrun.runner.replicas.restarts, ``from_json``: every field checked).
``restarted_words``: how many times which group restarted, in a few words (the end line, report.html)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GROUPS_NAMED = 4  # groups named one by one in restarted_words; more: counted (a 1,000-group job's end is one line)


@dataclass(frozen=True)
class GroupRestart:
    group: int
    restart: int  # 1 for its first restart: its ranks' new TORCHELASTIC_RESTART_COUNT
    budget: int  # --max_restarts: each group's own
    rank: int  # the job's rank whose end caused it
    cause: str  # what followed "rank N": "was killed by SIGKILL", "exited with code 1"
    at: float  # the wall clock (time.time()) when the node saw that rank's end
    others: tuple[int, ...]  # the groups on the same node whose ranks kept running (a node sees its own alone)

    def line(self, *, across_nodes: bool = False) -> str:
        """The console's line (the node's notice adds ``xrun[host]: ``); ``across_nodes``: the group spans nodes,
        and the head restarts it on each once its ranks are gone from every one (xrun.runner.replicas.spans)."""
        if across_nodes:
            return (f"replica group {self.group}: rank {self.rank} {self.cause}; stopping its ranks on this node, the "
                    f"head restarts group {self.group} on every node it spans (restart {self.restart} of "
                    f"{self.budget})")
        if not self.others:
            went_on = "no other group runs on this node"
        elif len(self.others) == 1:
            went_on = f"group {self.others[0]} keeps running"
        else:
            went_on = f"groups {', '.join(map(str, self.others))} keep running"
        return (f"replica group {self.group}: rank {self.rank} {self.cause}; restarting group {self.group} "
                f"(restart {self.restart} of {self.budget}), {went_on}")

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "restart": self.restart, "budget": self.budget, "rank": self.rank,
                "cause": self.cause, "at": self.at, "others": list(self.others)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupRestart:
        """From the wire: a field of the wrong type is a ValueError (a protocol error)."""
        others, at, cause = data.get("others"), data.get("at"), data.get("cause")
        if (not isinstance(others, list) or not all(_is_int(g) for g in others)
                or not isinstance(at, (int, float)) or isinstance(at, bool) or not isinstance(cause, str)):
            raise ValueError(f"a malformed group restart: {data!r}"[:200])
        return cls(group=_int(data, "group"), restart=_int(data, "restart"), budget=_int(data, "budget"),
                   rank=_int(data, "rank"), cause=cause, at=float(at), others=tuple(others))


def restarted_words(counts: Mapping[int, int]) -> str:
    """Each group's restarts (group -> how many) in a few words, once for the whole run: ``replica group 1
    restarted twice``, ``replica group 0 restarted once, group 3 3 times``; beyond GROUPS_NAMED groups their count
    and the total. Empty when no group restarted."""
    restarted = sorted((group, n) for group, n in counts.items() if n > 0)
    if len(restarted) > GROUPS_NAMED:
        return f"{len(restarted)} replica groups restarted, {_times(sum(n for _, n in restarted))} in all"
    return ", ".join(f"{'replica group' if i == 0 else 'group'} {group} {'restarted ' if i == 0 else ''}{_times(n)}"
                     for i, (group, n) in enumerate(restarted))


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"a malformed group restart: {key} is {value!r}"[:200])
    return value
