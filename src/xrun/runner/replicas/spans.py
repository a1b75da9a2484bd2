"""A replica group across nodes restarted by the head (``--replica_groups``, issue 39 §2): pure, like the job
machine (``xrun.runner.job.machine``) that asks it.

A group that lies within one node is that node's agent's alone (xrun.launch.replicas.supervision: no round trip).
A group whose ranks lie on several nodes is the head's: a rank's failure in it on node A stops A's ranks of it, and
A tells the head (``group_failed``); the head counts the restart against the group's budget (``GroupBook``, the
count every node of the group then starts from), tells every other node holding ranks of it to stop them
(``stop_group``), waits until each one's are gone (``group_stopped``; a node that is over, or lost, no longer
counts: a lost one ends the job), then tells each to start them again (``start_group``). A second failure in the
group while its restart is under way is part of it, not another restart. The budget is each node's to check
before it tells the head (the node that sees a failure with the budget spent fails the job, as for a group within
one node), and every node counts from the head's ``start_group``, so both agree.

A node lost with ranks of such a group, a hot spare standing by (xrun.runner.replicas.moves), is the group's restart
too (``moved``): the spare takes the lost node's ranks of it, the group's other nodes stop theirs, and once every
one's are gone they start again together with the spare's (its start waits for that). When the lost node led the
group (its rank 0's node, where its store and ``MASTER_ADDR`` were), the others' ranks of it meet at the spare from
then on: the start order carries its address.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from xrun.common.result.group_restart import GroupRestart
from xrun.runner.replicas.moves import GroupBook


@dataclass(frozen=True)
class SpanRestart:
    """A group across nodes restarts: the record's entry (``restart``, its count the head's), the nodes that hold
    ranks of it (node ranks, in order), and those the head tells to stop (every one but the failed rank's)."""

    restart: GroupRestart
    holders: tuple[int, ...]
    to_stop: tuple[int, ...]


class Spans:
    """The groups across nodes and the restart of each that is under way."""

    def __init__(self, book: GroupBook) -> None:
        self._book = book
        holders: dict[int, list[int]] = {}
        for node_rank, groups in enumerate(book.layout.nodes):
            for group, _ in groups:
                holders.setdefault(group, []).append(node_rank)
        self.holders = {group: tuple(nodes) for group, nodes in holders.items() if len(nodes) > 1}
        self._waiting: dict[int, set[int]] = {}  # a group restarting -> the nodes whose ranks of it are not yet gone
        self.leader_moved_to: dict[int, str] = {}  # a group whose leading node a spare took: the spare's host

    def failed(self, node_rank: int, restart: GroupRestart) -> SpanRestart | None:
        """Node ``node_rank`` saw ``restart`` (its rank's failure) in a group across nodes: the group's restart,
        counted; None when one is under way already (this node's stop is part of it) or the group is no such
        group."""
        group = restart.group
        holders = self.holders.get(group)
        if holders is None or group in self._waiting:
            return None
        self._book.restarts[group] += 1
        self._waiting[group] = set(holders)
        counted = replace(restart, restart=self._book.restarts[group], budget=self._book.layout.budget, others=())
        return SpanRestart(counted, holders, tuple(n for n in holders if n != node_rank))

    def waits(self, node_rank: int) -> bool:
        """A restart under way holds node ``node_rank``'s groups across nodes: a spare that took it starts later."""
        return any(group in self._waiting for group, nodes in self.holders.items() if node_rank in nodes)

    def moved(self, node_rank: int, group: int, spare: str, running: set[int]) -> tuple[int, ...]:
        """The lost node ``node_rank``'s ranks of ``group`` (one across nodes; its restart already counted by the
        move) go to the hot spare on ``spare``: the group's other nodes still ``running``, whose ranks of it must
        stop first."""
        holders = self.holders[group]
        if holders[0] == node_rank:
            self.leader_moved_to[group] = spare
        others = tuple(n for n in holders if n != node_rank and n in running)
        if others:
            self._waiting[group] = set(others)
        return others

    def stopped(self, node_rank: int, group: int) -> int | None:
        """Node ``node_rank``'s ranks of ``group`` are gone: the group's restart count once every node's are (its
        ranks start again everywhere), else None."""
        waiting = self._waiting.get(group)
        if waiting is None:
            return None
        waiting.discard(node_rank)
        if waiting:
            return None
        del self._waiting[group]
        return self._book.restarts[group]

    def over(self, node_rank: int) -> list[tuple[int, int]]:
        """Node ``node_rank`` is over (done): no restart waits for it any more; (group, restart) of each whose
        ranks now start again on the other nodes."""
        starts = []
        for group in list(self._waiting):
            restart = self.stopped(node_rank, group)
            if restart is not None:
                starts.append((group, restart))
        return starts
