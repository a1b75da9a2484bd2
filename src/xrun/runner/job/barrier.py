"""The job's start barrier (``xrun.runner.job.machine``): when the nodes are told to start, and with which endpoint.

A static job holds every node until all are ready, or until ``--join_timeout`` passes (naming the missing hosts), with a
status line every ``STATUS_EVERY`` while it holds; with ``--precheck`` it then holds them through the network check
(``RunPrecheck``; no join timeout meanwhile: the check bounds its own time) until the machine hears it passed
(``precheck_passed``), before every attempt (``--max_restarts``: each restart's barrier checks again). ``--elastic``
starts each node as soon as it is ready: torch's rendezvous is the barrier, and the job counts as started once
``--min_nodes`` run. Pure: the caller feeds the time and carries out the actions.
"""

from __future__ import annotations

from xrun.common.result.outcome import NODE_FAILURE_EXIT
from xrun.runner.job.config import ElasticRule, JobConfig
from xrun.runner.job.events import Action, Failure, RunPrecheck, SendStart, ShowLine, ShowStarted, ShowWaiting
from xrun.runner.job.nodes import Node, Nodes, NodeState
from xrun.runner.job.spares import Spares

STATUS_EVERY = 1.0  # the waiting-for-nodes status while the barrier holds


def reachable(addr: str | None, host: str, nodes: int) -> str:
    """Node 0's address as its agent saw it on the route to the head; loopback only helps a one-node job."""
    if addr is None or (nodes > 1 and (addr.startswith("127.") or addr == "::1")):
        return host
    return addr


class Barrier:
    """Holds the nodes until they may start; ``started_at`` is when the job started (None: not yet)."""

    def __init__(self, config: JobConfig, nodes: Nodes, *, t0: float, attempt: int = 0,
                 spares: Spares | None = None) -> None:
        self.config = config
        self.attempt = attempt  # --max_restarts: the attempt this barrier starts
        self.nodes = nodes
        self.t0 = t0
        self.started_at: float | None = None
        self.next_status = t0
        self.prechecking = False  # --precheck: every node is up, the network check runs
        self.prechecked = False  # --precheck: it ran (hot spares took bad nodes' places: no second check)
        self.spares = spares  # --spares: the spares on standby are checked by --precheck with the nodes

    def holding(self, *, stopping: bool) -> bool:
        """Still waiting for the nodes to come up (a stopping job waits for nothing)."""
        return self.started_at is None and not stopping and not self.prechecking

    def deadlines(self) -> list[float]:
        """While holding: the next status line and the join timeout."""
        return [self.next_status, self.t0 + self.config.join_timeout]

    def ready(self, node: Node, now: float) -> list[Action]:
        """``node`` is ready (and the job not stopping): start it (elastic), or every node once all are."""
        if self.config.elastic is not None:
            return self._start_elastic(node, self.config.elastic, now)
        return self.poke(now)

    def poke(self, now: float) -> list[Action]:
        """Once every node is up: the ranks start, or --precheck runs first (before every attempt); before the first,
        with hot spares still joining it waits for them (they are checked too, and a third node decides which side
        of a bad pair is bad), at most until ``--join_timeout``, then goes on without them. The machine pokes it
        when a spare is ready."""
        if self.nodes.up() != len(self.nodes):
            return []
        if not (self.config.precheck and not self.prechecked):
            return self._start_all(now)
        # a restart checks the spares standing by, and waits for none still joining: they had since the job began
        joining = self.attempt == 0 and self.spares is not None and self.spares.joining()
        return [] if joining and now - self.t0 < self.config.join_timeout else self._precheck()

    def precheck_passed(self, line: str, now: float) -> list[Action]:
        """--precheck found every node ok: ``line`` says so, and the ranks start."""
        self.prechecking = False
        return [ShowLine(line), *self._start_all(now)]

    def timed_out(self, now: float) -> Failure | None:
        """The join timeout, naming the hosts not ready, once ``--join_timeout`` has passed."""
        if now - self.t0 < self.config.join_timeout:
            return None
        missing = self.nodes.missing()
        if not missing:
            return None  # only spares were awaited: the next status goes on without them
        timeout = f"not ready within --join_timeout {self.config.join_timeout:g} s: {', '.join(missing)}"
        return Failure(", ".join(missing), timeout, NODE_FAILURE_EXIT)

    def status(self, now: float) -> list[Action]:
        """The waiting line, when due (every tick asks: the scan happens only once per line)."""
        if self.nodes.up() == len(self.nodes):
            return self.poke(now)  # only spares are awaited (--precheck): no waiting line
        if now < self.next_status:
            return []
        self.next_status = now + STATUS_EVERY
        return [ShowWaiting(self.nodes.up(), tuple(self.nodes.missing()), now - self.t0)]

    def _precheck(self) -> list[Action]:
        """Every node is up: the network check across them, before every attempt (--max_restarts: a link that went
        bad meanwhile, often the failure's cause, would make the next attempt crawl)."""
        self.prechecking = True
        standby = self.spares.ready() if self.spares is not None else []
        checked = [*(n for n in self.nodes if n.connected and not n.over), *standby]
        return [RunPrecheck(tuple(n.agent for n in checked), self._master_addr(), tuple(n.host for n in checked))]

    def reopen(self, now: float) -> None:
        """--precheck put hot spares in bad nodes' places: hold again until they are ready (a fresh
        ``--join_timeout``), then start without a second check (the spares passed this one)."""
        self.prechecking, self.prechecked, self.t0, self.next_status = False, True, now, now

    def _master_addr(self) -> str:
        node0 = self.nodes[0]
        return self.config.master_addr or reachable(node0.addr, node0.host, len(self.nodes))

    def _master_port(self) -> int | None:
        node0, config = self.nodes[0], self.config
        picked = config.pick_master_port or not config.master_port
        return node0.master_port if picked and node0.master_port else config.master_port

    def start_late(self, node: Node) -> list[Action]:
        """--replica_groups: a hot spare that took a lost node's place is ready after the start: it alone starts,
        told the attempt's endpoint (node 0's, where the Lighthouse listens; its own groups meet at the spare)."""
        node.state = NodeState.RUNNING
        return [SendStart((node.agent,), self._master_addr(), self._master_port(), self.attempt)]

    def _start_all(self, now: float) -> list[Action]:
        config = self.config
        master_addr = self._master_addr()
        master_port = self._master_port()
        self.started_at = now
        started = ShowStarted(len(self.nodes), config.world_size, now - self.t0, master_addr, master_port)
        for node in self.nodes:
            node.state = NodeState.RUNNING
        return [started, SendStart(self.nodes.reachable(), master_addr, master_port, self.attempt)]

    def _start_elastic(self, node: Node, rule: ElasticRule, now: float) -> list[Action]:
        node.state = NodeState.RUNNING
        start = SendStart((node.agent,), rule.master_addr, self.config.master_port)
        started = self.nodes.running()
        if self.started_at is None and started >= rule.min_nodes:
            self.started_at = now
        return [start, ShowLine(f"{node.host} up after {now - self.t0:.1f} s: its elastic agent joins the rendezvous "
                                f"({started}/{len(self.nodes)} nodes up, --min_nodes {rule.min_nodes})")]
