"""``--replica_groups`` at the head (issue 39 §2): what the job machine (``xrun.runner.job.machine``) decides of the
replica groups, beside the nodes' own restarts of a group within one node (xrun.launch.replicas.supervision).

It keeps each group's restarts (``GroupBook``, xrun.runner.replicas.moves) and the restarts under way of the
groups across nodes (``Spans``, xrun.runner.replicas.spans), and answers the machine in actions: a group across
nodes failed on one node (the others stop their ranks of it), its ranks gone everywhere (they all start again), and
a node lost while the ranks run, whose groups move to a hot spare on standby (each a restart of its budget; a
group across nodes stops on its other nodes first and starts there again with the spare's, whose start waits for
that). Pure, like the machine that owns it.
"""

from __future__ import annotations

from xrun.runner.job.barrier import Barrier
from xrun.runner.job.events import (
    Action,
    GroupFailed,
    GroupRestartedAcross,
    GroupsMoved,
    Replacement,
    SendGroupOrder,
    SendSpec,
    ShowLine,
)
from xrun.runner.job.nodes import Node, Nodes, NodeState
from xrun.runner.job.spares import Spares
from xrun.runner.replicas.moves import GroupBook, GroupLayout
from xrun.runner.replicas.spans import Spans


class Groups:
    """The groups' restarts as the head knows them, and the rules the machine asks of them."""

    def __init__(self, layout: GroupLayout, nodes: Nodes, spares: Spares) -> None:
        self.book = GroupBook(layout)
        self.spans = Spans(self.book)  # the groups across nodes: their restarts are the head's
        self.nodes = nodes
        self.spares = spares

    def failed(self, event: GroupFailed) -> list[Action]:
        """A rank of a group across nodes failed on the event's node, which is stopping its ranks of it: the restart
        is counted, and every other node holding ranks of it told to stop them; no other node hears of it."""
        node = self.nodes.by_agent[event.node]
        span = self.spans.failed(node.rank, event.restart)
        if span is None:
            return []  # its restart is under way: this node's stop is part of it
        restart, hosts = span.restart, tuple(self.nodes[n].host for n in span.holders)
        return [
            GroupRestartedAcross(node.host, hosts, restart),
            ShowLine(f"replica group {restart.group}: rank {restart.rank} {restart.cause} on {node.host}; restarting "
                     f"group {restart.group} on {', '.join(hosts)} (restart {restart.restart} of {restart.budget}), "
                     "every other group keeps running"),
            SendGroupOrder(tuple(self.nodes[n].agent for n in span.to_stop), restart.group),
        ]

    def stopped(self, node_rank: int, group: int, barrier: Barrier) -> list[Action]:
        """Node ``node_rank``'s ranks of a group across nodes are gone; once every node's are, each starts them."""
        restart = self.spans.stopped(node_rank, group)
        return [] if restart is None else self._start(group, restart, barrier)

    def over(self, node_rank: int, barrier: Barrier) -> list[Action]:
        """Node ``node_rank`` is done: a restart across nodes waits no longer for its ranks."""
        return [a for group, restart in self.spans.over(node_rank) for a in self._start(group, restart, barrier)]

    def ready_late(self, node: Node, barrier: Barrier) -> list[Action]:
        """A hot spare in a lost node's place is ready after the start: it starts, unless a group of it across
        nodes still waits for its other nodes' stop (then ``_start`` starts it)."""
        return [] if self.spans.waits(node.rank) else barrier.start_late(node)

    def why_stay(self, node: Node) -> str | None:
        """None when the lost ``node``'s groups can move to a hot spare on standby (each has a restart left, it is
        not node 0, no group of it is restarting across nodes); else what its loss's reason adds."""
        why = self.book.why_not(node.rank) or (None if self.spares.ready() else "no hot spare stands by (--spares)")
        if why is None and self.spans.waits(node.rank):
            why = "a group of it across nodes is restarting already"
        return None if why is None else f"; its replica groups cannot start again elsewhere: {why}"

    def move(self, node: Node, reason: str, attempt: int) -> tuple[Replacement, list[Action]]:
        """The lost ``node`` (``reason``) hands its groups to the next hot spare on standby: the spare is sent the
        node's spec, those groups' restart counts with it, and starts once ready (``ready_late``); each group's move
        is a restart of its budget; every other node runs on untouched but those holding ranks of a group across
        nodes of it, which stop them first."""
        lost = node.host
        replacement, out = self.spares.seat(self.nodes, node, attempt)
        moves = self.book.move(node.rank)
        counts = ", ".join(f"group {m.group} restart {m.restart} of {self.book.layout.budget}" for m in moves)
        out += [GroupsMoved(node.rank, lost, node.host, reason, moves),
                ShowLine(f"the replica groups of {lost} start again on {node.host} ({counts}); every other node's "
                         "groups keep running"),
                SendSpec(node.agent, False, node_rank=node.rank, group_restarts=tuple((m.group, m.restart)
                                                                                      for m in moves))]
        running = {n.rank for n in self.nodes if not n.over}
        for move in moves:
            if move.group in self.spans.holders:
                others = self.spans.moved(node.rank, move.group, node.host, running)
                if others:
                    out.append(SendGroupOrder(tuple(self.nodes[n].agent for n in others), move.group))
        return replacement, out

    def _start(self, group: int, restart: int, barrier: Barrier) -> list[Action]:
        """The group across nodes starts again on each of its nodes still running; a hot spare that took a node of
        it, ready and held by no other group, starts now."""
        holders = [self.nodes[n] for n in self.spans.holders[group] if not self.nodes[n].over]
        running = tuple(n.agent for n in holders if n.state is NodeState.RUNNING)
        out: list[Action] = []
        if running:
            out.append(SendGroupOrder(running, group, restart, self.spans.leader_moved_to.get(group)))
        for spare in holders:
            if spare.state is NodeState.READY and not self.spans.waits(spare.rank):
                out += barrier.start_late(spare)
        return out
