"""The job's node bookkeeping (``xrun.runner.job.machine``): each node's state and connection, and the counts the
rules read after every message.

A node goes WAITING -> JOINED (its hello admitted) -> READY (its agent is ready) -> RUNNING (told to start) and
ends DONE or LOST. The counts are kept as nodes change (``Tally``): scanning every node per message made the start
barrier and a stop quadratic in the nodes (10,000 simulated agents took minutes to join: issue 15).

A node rank (the node's place in the world: its slots, its ranks) and the agent that runs it are two things: agents
are numbered by the order the backend started them (the world's nodes first, then the hot spares, issue 23), and
each node holds the id of the agent that runs it (``Node.agent``; its node rank until a spare takes its place).
Every message and action names the agent; ``Nodes.by_agent`` finds the node it runs.
"""

from __future__ import annotations

import enum


class NodeState(enum.Enum):
    WAITING = "waiting"
    JOINED = "joined"
    READY = "ready"
    RUNNING = "running"
    DONE = "done"
    LOST = "lost"


UP = (NodeState.READY, NodeState.RUNNING)  # running too: an elastic node starts as soon as it is ready
OVER = (NodeState.DONE, NodeState.LOST)


class Tally:
    """How many nodes are in each state and how many are live (connected, not over), kept as nodes change."""

    def __init__(self, nodes: int) -> None:
        self.states = dict.fromkeys(NodeState, 0)
        self.states[NodeState.WAITING] = nodes
        self.live = 0

    def count(self, states: tuple[NodeState, ...]) -> int:
        return sum(self.states[state] for state in states)

    def moved(self, old: tuple[NodeState, bool], new: tuple[NodeState, bool]) -> None:
        """One node went from (state, connected) ``old`` to ``new``."""
        self.states[old[0]] -= 1
        self.states[new[0]] += 1
        self.live += _live(*new) - _live(*old)


def _live(state: NodeState, connected: bool) -> int:
    return int(connected and state not in OVER)


class Node:
    """One node as the job sees it; ``state`` and ``connected`` keep the nodes' ``Tally`` up to date."""

    __slots__ = ("rank", "agent", "host", "addr", "master_port", "exit_code", "last_seen", "_state", "_connected",
                 "_tally")

    def __init__(self, rank: int, host: str, tally: Tally) -> None:
        self.rank = rank
        self.agent = rank  # the id of the agent that runs it (a hot spare's, once one took its place)
        self.host = host
        self.addr: str | None = None
        self.master_port: int | None = None
        self.exit_code: int | None = None
        self.last_seen = 0.0
        self._state = NodeState.WAITING
        self._connected = False
        self._tally = tally

    @property
    def state(self) -> NodeState:
        return self._state

    @state.setter
    def state(self, value: NodeState) -> None:
        self._tally.moved((self._state, self._connected), (value, self._connected))
        self._state = value

    @property
    def connected(self) -> bool:
        return self._connected

    @connected.setter
    def connected(self, value: bool) -> None:
        self._tally.moved((self._state, self._connected), (self._state, value))
        self._connected = value

    @property
    def over(self) -> bool:
        return self._state in OVER


class Nodes(list[Node]):
    """The nodes by node rank, and the counts the rules read (from the tally: no scan per message)."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        self.tally = Tally(len(hosts))
        super().__init__(Node(rank, host, self.tally) for rank, host in enumerate(hosts))
        self.by_host: dict[str, list[Node]] = {}
        for node in self:
            self.by_host.setdefault(node.host, []).append(node)
        self.by_agent = {node.agent: node for node in self}

    def seat(self, node: Node, agent: int, host: str) -> None:
        """Agent ``agent`` on ``host`` (a hot spare) runs ``node`` from now on; its old agent and host are no
        longer found."""
        del self.by_agent[node.agent]
        self.by_host[node.host].remove(node)
        node.agent, node.host = agent, host
        self.by_agent[agent] = node
        self.by_host.setdefault(host, []).append(node)

    def faulty(self, *, rejoin: bool = False) -> list[Node]:
        """A scan, once per attempt: the nodes the next attempt cannot have back as they are. Their agent is lost or
        gone, or failed its preflight (a hot spare may take their places). With ``rejoin`` (pod mode with
        ``--max_restarts``, where a lost node other than node 0 may come back) only the nodes whose agent is gone
        and that the next attempt cannot wait for: node 0 (it hosts the channel), and a node already awaited at the
        barrier of the attempt just over that did not come within ``--join_timeout``."""
        if rejoin:
            return [n for n in self if not n.connected and (n.rank == 0 or n.state is NodeState.WAITING)]
        return [n for n in self if n.state is NodeState.LOST or not n.connected]

    def join(self, node: Node, addr: str, now: float, *, name: str | None = None) -> None:
        """``node``'s hello was admitted; with ``name`` (pod mode without host names) it goes by the host name it
        reported from now on, unless another node already does (pods on one host: ``node K (name)`` then)."""
        node.state, node.connected, node.addr, node.last_seen = NodeState.JOINED, True, addr, now
        if name is not None and name != node.host:
            self.rename(node, name if name not in self.by_host else f"node {node.rank} ({name})")

    def rename(self, node: Node, name: str) -> None:
        self.by_host[node.host].remove(node)
        if not self.by_host[node.host]:
            del self.by_host[node.host]
        node.host = name
        self.by_host.setdefault(name, []).append(node)

    def up(self) -> int:
        return self.tally.count(UP)

    def running(self) -> int:
        return self.tally.states[NodeState.RUNNING]

    def missing(self) -> list[str]:
        """A scan: for the status line and the join timeout only."""
        return [n.host for n in self if n.state not in UP]

    def left(self) -> int:
        """Still running, or may still join."""
        return len(self) - self.tally.count(OVER)

    def reachable(self) -> tuple[int, ...]:
        """The agents of the nodes connected and not over. A scan: once per start, stop and ping round, not per
        message."""
        return tuple(n.agent for n in self if n.connected and not n.over)

    def live(self) -> list[Node]:
        """A scan, once per ping round: the nodes connected and not over (the keepalive's to check)."""
        return [n for n in self if n.connected and not n.over]

    def ping_round(self, now: float, dead_after: float, *, done_too: bool) -> tuple[list[Node], tuple[int, ...]]:
        """A scan, once per ping round: the live nodes silent for ``dead_after`` (lost), and the nodes to ping
        (the other live ones, and with ``done_too`` the connected nodes done, which wait for a restart)."""
        silent = [n for n in self.live() if now - n.last_seen > dead_after]
        gone = {n.agent for n in silent}
        pinged = tuple(n.agent for n in self if n.connected and n.agent not in gone
                       and (not n.over or (done_too and n.state is NodeState.DONE)))
        return silent, pinged

    def lost_hosts(self) -> set[str]:
        return {n.host for n in self if n.state is NodeState.LOST}

    def all_over(self, *, stopping: bool) -> bool:
        """Nothing more to hear: once stopping, a node whose agent never connected will not."""
        return self.tally.live == 0 if stopping else self.tally.count(OVER) == len(self)
