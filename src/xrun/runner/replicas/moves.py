"""A lost node's replica groups moved to a hot spare (``--replica_groups`` with ``--spares``, issue 39 §2): the
head's count of each group's restarts, and whether a lost node's groups can start again elsewhere.

With ``--spares`` each group lies within one node (``xrun.runner.plan``), and its node's agent restarts it after a
rank's death on its own, telling the head (``group_restarted``, counted here by ``heard``); a group across nodes,
refused with spares, is restarted by the head (xrun.runner.replicas.spans), counted in the same ``restarts``. A
node's loss is the head's to handle: when every group on the lost node has a restart left of its budget
(``--max_restarts``, each group's own) and a spare stands by, the spare takes the node's place and only those groups
start again there, each restart counted (``move``); the other nodes hear nothing of it. Node 0 is never moved: it
hosts the Lighthouse and the channel. Pure, like the job machine (``xrun.runner.job.machine``) that asks it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from xrun.common.spec import replica_group


@dataclass(frozen=True)
class GroupLayout:
    """Where the groups lie: for each node rank, its groups and the job's first rank of each on it; ``budget``:
    each group's ``--max_restarts``."""

    budget: int
    nodes: tuple[tuple[tuple[int, int], ...], ...]  # node rank -> ((group, its first rank there), ...)

    @classmethod
    def of(cls, nodes_ranks: list[list[tuple[int, Mapping[str, str]]]], budget: int) -> GroupLayout:
        """From each node's ranks (the job's rank and its environment), in node order."""
        layout = []
        for ranks in nodes_ranks:
            first: dict[int, int] = {}
            for rank, env in sorted(ranks):
                first.setdefault(replica_group(env), rank)
            layout.append(tuple(first.items()))
        return cls(budget, tuple(layout))


@dataclass(frozen=True)
class GroupMove:
    """One group of a lost node, started again on the spare: its restart (1 for its first), and the job's rank
    that stands for it in the record (its first rank on the node)."""

    group: int
    restart: int
    rank: int


class GroupBook:
    """Each group's restarts so far, as the head knows them."""

    def __init__(self, layout: GroupLayout) -> None:
        self.layout = layout
        self.restarts = {group: 0 for node in layout.nodes for group, _ in node}

    def heard(self, group: int, restart: int) -> None:
        """A node restarted ``group`` on its own (its ``restart``-th): the count the node keeps, kept here too."""
        if group in self.restarts:
            self.restarts[group] = max(self.restarts[group], restart)

    def why_not(self, node_rank: int) -> str | None:
        """Why the lost node ``node_rank``'s groups cannot start again on a spare (None: they can, if one stands
        by)."""
        if node_rank == 0:
            return "node 0 hosts torchft's Lighthouse and xrun's channel, so no spare can take its place"
        spent = [g for g, _ in self.layout.nodes[node_rank] if self.restarts[g] >= self.layout.budget]
        if not self.layout.budget:
            return "its groups have no restarts (--max_restarts 0)"
        if spent:
            which = ", ".join(map(str, spent))
            return f"the restarts of its group(s) {which} are spent (--max_restarts {self.layout.budget})"
        return None

    def move(self, node_rank: int) -> tuple[GroupMove, ...]:
        """The lost node ``node_rank``'s groups start again elsewhere: each one's restart counted."""
        moves = []
        for group, rank in self.layout.nodes[node_rank]:
            self.restarts[group] += 1
            moves.append(GroupMove(group, self.restarts[group], rank))
        return tuple(moves)
