"""Supervision by replica group (``--replica_groups``, issue 39 §2): the pure policy a rank group
(xrun.launch.ranks.supervise) follows.

A rank that fails on its own in group g, while the node is not stopping and g has restarts left of its budget
(``--max_restarts``, each group its own), stops g only: g's live ranks get SIGTERM against one deadline
(``--shutdown_timeout``), SIGKILL at it (``overdue``), no rank of another group is signalled. Once g's last rank is
collected (``gone``) the rank group starts g again (a new, empty store first). A failure
in a group whose budget is spent is a failure of the job, as without groups: the quorum does not go on without a
group that cannot come back (the user asked for every group to finish), so every rank is stopped.

A group that spans nodes (``shared``: fewer of its ranks here than its ``WORLD_SIZE``) is the head's to restart
(xrun.runner.replicas.spans): a failure here stops its ranks here as above and the head hears of it; the head's
``stop_group`` stops them alike (``order_stop``). Once they are gone the group is ``held`` (the rank group tells
the head, and the node is not over while one is held) until the head's ``start_group`` (``start``), which carries
the restart count every node of the group counts from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from xrun.common.result.group_restart import GroupRestart
from xrun.common.spec import RESTART_COUNT, replica_group


class GroupPolicy:
    """Each group's restarts and its stop in progress. ``groups``: the node's ranks -> their group."""

    def __init__(self, groups: Mapping[int, int], budget: int, restarts: Mapping[int, int] | None = None,
                 shared: Iterable[int] = ()) -> None:
        self._group_of = dict(groups)
        self.budget = budget
        self.shared = frozenset(shared)  # the groups that span nodes: their restarts are the head's
        self._held: set[int] = set()  # shared groups whose ranks here are gone, waiting for the head's start
        self._restarts = dict.fromkeys(groups.values(), 0) | dict(restarts or {})  # a moved group's so far
        self._deadlines: dict[int, float | None] = {}  # a group being stopped -> its SIGKILL deadline (None: sent)

    @classmethod
    def of(cls, ranks: Iterable[tuple[int, Mapping[str, str]]], budget: int) -> GroupPolicy:
        """From each rank's number and environment: its group, and the group's restarts so far (its
        ``TORCHELASTIC_RESTART_COUNT``: 0, but for the groups of a lost node that a hot spare took over, which go on
        counting against their budget, xrun.runner.replicas.moves)."""
        ranks = list(ranks)
        here = Counter(replica_group(env) for _, env in ranks)
        return cls({rank: replica_group(env) for rank, env in ranks}, budget,
                   {replica_group(env): int(env.get(RESTART_COUNT) or 0) for _, env in ranks},
                   shared={replica_group(env) for _, env in ranks
                           if here[replica_group(env)] < int(env.get("WORLD_SIZE") or 0)})

    def group_of(self, rank: int) -> int:
        return self._group_of[rank]

    def members(self, group: int) -> list[int]:
        return [rank for rank, g in self._group_of.items() if g == group]

    def stopping(self, group: int) -> bool:
        """Its ranks here are being stopped, or (a shared group) are gone and wait for the head's start."""
        return group in self._deadlines or group in self._held

    def held(self) -> bool:
        """A shared group waits for the head's start: the node is not over."""
        return bool(self._held)

    def restarts(self, group: int) -> int:
        return self._restarts[group]

    def restarted(self) -> tuple[tuple[int, int], ...]:
        """(group, its restarts) of each group restarted, for the node's end line."""
        return tuple((group, n) for group, n in sorted(self._restarts.items()) if n)

    def fail(self, rank: int, cause: str, *, running: Iterable[int], wall: float, deadline: float
             ) -> GroupRestart | None:
        """``rank`` failed on its own (``cause``: what followed "rank N"), while the groups ``running`` still have
        live ranks: its group's restart, its stop due SIGKILL at ``deadline``; None when the budget is spent."""
        group = self._group_of[rank]
        if self._restarts[group] >= self.budget or self.stopping(group):
            return None
        self._restarts[group] += 1
        self._deadlines[group] = deadline
        others = tuple(sorted(set(running) - {group}))
        return GroupRestart(group=group, restart=self._restarts[group], budget=self.budget, rank=rank, cause=cause,
                            at=wall, others=others)

    def due(self) -> float | None:
        """The next SIGKILL deadline (monotonic) of a group being stopped; None: none."""
        return min((d for d in self._deadlines.values() if d is not None), default=None)

    def overdue(self, now: float) -> list[int]:
        """The groups whose deadline passed, each given once: their live ranks get SIGKILL."""
        late = [g for g, d in self._deadlines.items() if d is not None and now >= d]
        for group in late:
            self._deadlines[group] = None
        return late

    def order_stop(self, group: int, *, deadline: float) -> bool:
        """The head's ``stop_group`` for a shared ``group``: True when its stop begins now (False: it is stopping or
        held already, or is no group of this node's)."""
        if group not in self.shared or self.stopping(group):
            return False
        self._deadlines[group] = deadline
        return True

    def gone(self, group: int) -> bool:
        """Every rank of ``group`` here is collected: True when it starts again at once (a group of this node's
        alone); False for a shared group, now held until the head's ``start``."""
        del self._deadlines[group]
        if group in self.shared:
            self._held.add(group)
            return False
        return True

    def start(self, group: int, restart: int) -> bool:
        """The head's ``start_group``: a held shared group starts again as its ``restart``-th (True); False when it
        is not held here."""
        if group not in self._held:
            return False
        self._held.discard(group)
        self._restarts[group] = restart
        return True
