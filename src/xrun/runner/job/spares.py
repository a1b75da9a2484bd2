"""Hot spares (``--spares N``, issue 23): agents that start with the job, pass the same preflight and wait connected
outside the world, and the seating of one in a lost node's place.

The backend starts the spares' agents after the world's, so their agent ids follow the world's (``JobConfig.spares``
names their hosts in that order). A spare's hello is answered with a standby spec (``SendSpec(standby=True)``: node
0's with the spare's host, so its preflight checks the same interpreter, script and log directory); its ``ready``
puts it on standby, and from then on it is pinged like any node. A spare that fails its preflight, drops, goes
silent or whose session ends is lost, said in one line; the job goes on without it.

A spare takes a place in two ways, both the job's rules (``xrun.runner.job.machine``): ``--precheck`` found a node bad
before the ranks start (with or without ``--max_restarts``: no restart, issue 33), or, with ``--max_restarts``, an
attempt is over with nodes lost (``Nodes.faulty``). ``seat`` gives each the next spare on standby: the node
keeps its rank and slots, the spare's agent is sent the node's spec with its own host, and the lost node's agent id
is no longer anyone's, so whatever it says later changes nothing and its host is not used again. Pure, like the
machine (``xrun.runner.job.machine``) that owns it.
"""

from __future__ import annotations

from xrun.runner.job.events import (
    Action,
    Admit,
    AgentError,
    AgentEvent,
    ConnectionLost,
    Drop,
    HelloReceived,
    Ready,
    Replacement,
    SendSpec,
    ShowLine,
    TurnAway,
)
from xrun.runner.job.nodes import Node, Nodes, NodeState, Tally


class Spares:
    """The spares still standing by (or still to connect), by agent id, and the hosts the job will not use again."""

    def __init__(self, hosts: tuple[str, ...], *, first_agent: int, role: str) -> None:
        tally = Tally(len(hosts))  # their own counts: a spare never counts among the world's nodes
        self.role = role  # what a spare is there for (``JobConfig.spare_role``), said when one stands by
        self.standing = {first_agent + i: Node(first_agent + i, host, tally) for i, host in enumerate(hosts)}
        self.gone: set[str] = set()  # lost spares and nodes a spare replaced: the job never uses them again

    def ready(self) -> list[Node]:
        """The spares on standby (their preflight passed), in agent order: the next to take a place first."""
        return [s for s in self.standing.values() if s.connected and s.state is NodeState.READY]

    def joining(self) -> bool:
        """A spare not lost is not on standby yet (its agent is still to connect, or in its preflight)."""
        return any(s.state is not NodeState.READY for s in self.standing.values())

    def connected(self) -> tuple[int, ...]:
        return tuple(s.agent for s in self.standing.values() if s.connected)

    def release(self) -> tuple[int, ...]:
        """The job is over: the spares connected (to be told the verdict; each exits 0). From now on none stands
        by, so their agents leaving is no news."""
        told = self.connected()
        self.standing = {}
        return told

    # -- what the spares' agents say ----------------------------------------------------------------------------

    def hello(self, event: HelloReceived, now: float, *, ending: bool) -> list[Action]:
        """A spare's hello (or one from an agent id that is no one's any more: a replaced node's)."""
        spare = self.standing.get(event.node)
        if spare is None or spare.state is not NodeState.WAITING or ending:
            return [TurnAway(event.conn)]
        spare.state, spare.connected, spare.addr, spare.last_seen = NodeState.JOINED, True, event.addr, now
        return [Admit(spare.agent, event.conn), SendSpec(spare.agent, pick_master_port=False, standby=True)]

    def heard(self, event: AgentEvent, now: float) -> list[Action]:
        """A spare's message: ready is standby; an error (its preflight) or a dropped connection loses it."""
        spare = self.standing.get(event.node)
        if spare is None or not spare.connected:
            return []  # a replaced node's late word, or a spare already lost
        spare.last_seen = now
        if isinstance(event, Ready):
            spare.state = NodeState.READY
            return [ShowLine(f"spare {spare.host} is standing by (hot: it takes {self.role})")]
        if isinstance(event, AgentError):
            return self.lose(spare, f"it cannot stand by: {event.message}")
        if isinstance(event, ConnectionLost):
            spare.connected = False
            return self.lose(spare, f"its agent's connection dropped ({event.reason})")
        return []  # a pong

    def session_ended(self, host: str | None, detail: str = "") -> list[Action]:
        """A backend session ended (None: the one of every node): a spare whose agent never connected is lost."""
        ended = [s for s in self.standing.values() if not s.connected and host in (None, s.host)]
        why = "its session ended before its agent joined" + (f" ({detail})" if detail else "")
        return [action for spare in ended for action in self.lose(spare, why)]

    def ping_round(self, now: float, dead_after: float) -> tuple[list[Action], tuple[int, ...]]:
        """The spares silent for ``dead_after`` are lost; the others connected are to be pinged."""
        silent = [s for s in self.standing.values() if s.connected and now - s.last_seen > dead_after]
        actions = [a for s in silent for a in self.lose(s, f"no word from its agent for {dead_after:g} s")]
        return actions, self.connected()

    def lose(self, spare: Node, reason: str) -> list[Action]:
        del self.standing[spare.agent]
        self.gone.add(spare.host)
        actions: list[Action] = [ShowLine(f"spare {spare.host} is lost: {reason}; {len(self.standing)} spare(s) left")]
        if spare.connected:
            spare.connected = False
            actions.append(Drop(spare.agent))
        return actions

    # -- a lost node's place ------------------------------------------------------------------------------------

    def seat_all(self, nodes: Nodes, lost: list[Node], attempt: int) -> tuple[tuple[Replacement, ...], list[Action]]:
        """A spare on standby in each of the ``lost`` nodes' places (the caller made sure there are enough)."""
        seated, actions = [], []
        for node in lost:
            replacement, seating = self.seat(nodes, node, attempt)
            seated.append(replacement)
            actions += seating
        return tuple(seated), actions

    def seat(self, nodes: Nodes, node: Node, attempt: int, spare_agent: int | None = None
             ) -> tuple[Replacement, list[Action]]:
        """The spare ``spare_agent`` (default: the next on standby) runs ``node`` (lost) from ``attempt`` on: same
        node rank, same slots. The caller sends the spare the node's spec (``SendSpec(node_rank=...)``)."""
        spare = self.ready()[0] if spare_agent is None else self.standing[spare_agent]
        del self.standing[spare.agent]
        actions: list[Action] = [Drop(node.agent)] if node.connected else []  # a lost agent still connected: gone
        node.connected = False
        lost = node.host
        self.gone.add(lost)
        nodes.seat(node, spare.agent, spare.host)
        node.addr, node.last_seen, node.master_port, node.exit_code = spare.addr, spare.last_seen, None, None
        node.state, node.connected = NodeState.JOINED, True
        replacement = Replacement(node.rank, lost, spare.host, attempt)
        actions.append(ShowLine(f"node {node.rank} ({lost}) is lost: the hot spare {spare.host} takes its place "
                                f"(node rank {node.rank}, same slots); {lost} is not used again"))
        return replacement, actions

