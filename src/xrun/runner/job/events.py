"""The job state machine's vocabulary (``xrun.runner.job.machine``): events in, actions out, and the job's verdict.

Every value here is a typed, immutable record of plain fields: no sockets, no clocks. They are ``NamedTuple``s, as
the node's are (``xrun.launch.session.events`` says why: a class costs ~0.06 ms to make against a frozen dataclass's
~0.6 ms, and these 32 are on every run's start, a local one's included), but unlike bare tuples two records of
different types never compare equal (``_typed_equality``, at the end); and without ``from __future__ import
annotations``, since ``NamedTuple`` compiles every string annotation into a ``ForwardRef`` (that was half of this
module's load): only names defined further down or under ``TYPE_CHECKING`` are quoted. Agents are named by their
agent id (the order the backend started them: the world's nodes first, whose ids are their node ranks, then the hot
spares; ``NodesFaulty`` alone names node ranks); connections by the number the socket layer gave them, so an action
can say which connection to keep or close without the machine holding one.

Events come from the socket layer (``xrun.runner.job.control_server``): what an agent said, a connection that dropped, a
backend session that ended, a signal to xrun, the hang doctor's ``Hung`` (xrun.runner.job.doctor), and ``Tick``
(time passed). Actions go back to it: what to send
to which nodes, which connection to admit or close, and what to show the user. ``Verdict`` is the outcome: the
exit code and its root cause, as data the report prints and (pod mode, ``SendVerdict``) every node is sent.
"""

from typing import TYPE_CHECKING, NamedTuple, Union

if TYPE_CHECKING:
    from xrun.common.result.group_restart import GroupRestart
    from xrun.runner.network.node_results import PrecheckResult
    from xrun.runner.pod.digest import PlanDigest
    from xrun.runner.replicas.moves import GroupMove

# -- events ---------------------------------------------------------------------------------------------------


class HelloReceived(NamedTuple):
    """An agent presented this run's token for ``node`` on connection ``conn`` (not yet admitted)."""

    node: int
    conn: int
    addr: str  # the node's address as its agent saw it on the route here (else the peer address)
    peer: str
    xrun_version: str | None = None
    digest: "PlanDigest | None" = None  # pod mode: the node's plan digest (None: absent or malformed)
    host: str | None = None  # the host name the node reports (checked printable text: xrun.channel.fields)


class Ready(NamedTuple):
    """The node's agent is ready to start its ranks; node 0's reports the master port it checked or picked."""

    node: int
    master_port: int | None = None


class RankExited(NamedTuple):
    node: int
    rank: int | None
    local_rank: int | None
    code: int | None = None
    signal: int | None = None
    stopped: bool = False  # xrun stopped it: a consequence, never a root cause
    tail: tuple[str, ...] = ()


class Done(NamedTuple):
    """The node's agent finished; ``exit_code`` is its node's exit code."""

    node: int
    exit_code: int = 0


class AgentError(NamedTuple):
    node: int
    message: str
    exit_code: int = 1  # the job's code: 2 for what the user can fix (an explicit --master_port taken on node 0)


class Heard(NamedTuple):
    """Any other message from the node's agent (started, pong): it is alive."""

    node: int


class GroupRestarted(NamedTuple):
    """--replica_groups: the node's agent restarted one of its groups on its own (``restart``: the how-many-th of
    its budget); the head counts it, for a lost node's groups moved to a hot spare (xrun.runner.replicas.moves)."""

    node: int
    group: int
    restart: int


class GroupFailed(NamedTuple):
    """--replica_groups: a rank of a group across nodes failed on the node, whose ranks of it are stopping; the
    head restarts the group on every node it spans (xrun.runner.replicas.spans)."""

    node: int
    restart: "GroupRestart"  # the node's word: its count, the head counts its own


class GroupStopped(NamedTuple):
    """--replica_groups: the node's ranks of a group across nodes are gone."""

    node: int
    group: int


class ConnectionLost(NamedTuple):
    """The node's connection closed or broke (the socket layer has already closed it)."""

    node: int
    reason: str


class SessionEnded(NamedTuple):
    """A backend session ended (``host`` None: the one session of every node, e.g. pdsh)."""

    host: str | None
    code: int | None
    detail: str = ""


class SignalReceived(NamedTuple):
    signum: int


class Hung(NamedTuple):
    """--hang_action stop|restart: every running node was silent for --hang_timeout and the stacks were shown."""

    reason: str
    restart: bool = False  # --hang_action restart: a failure like any other (with --max_restarts)
    root_cause: str | None = None  # the hang doctor's: the collective held and the rank that never entered


class PrecheckDone(NamedTuple):
    """--precheck (issue 24): the network check across the nodes is over (xrun.runner.network.precheck_channel)."""

    result: "PrecheckResult"


class NodesFaulty(NamedTuple):
    """These nodes are bad (``--precheck``'s network check, issue 24): before the attempt's start each is replaced
    by a hot spare at once, if enough are standing by, else the job ends naming them; later, each is a lost node."""

    node_ranks: tuple[int, ...]
    reason: str


class Tick(NamedTuple):
    """Time passed: deadlines (join, stop, keepalive, linger) are checked against the ``now`` it is fed with."""


# Sent by an admitted agent: the machine ignores them from a node without a connection.
AGENT_EVENTS = (Ready, RankExited, Done, AgentError, Heard, GroupRestarted, GroupFailed, GroupStopped, ConnectionLost)
AgentEvent = Union[Ready, RankExited, Done, AgentError, Heard, GroupRestarted, GroupFailed, GroupStopped,
                   ConnectionLost]
Event = Union[
    HelloReceived, Ready, RankExited, Done, AgentError, Heard, GroupRestarted, GroupFailed, GroupStopped,
    ConnectionLost, SessionEnded,
    SignalReceived, Hung, NodesFaulty, Tick, PrecheckDone,
]

# -- actions --------------------------------------------------------------------------------------------------


class Admit(NamedTuple):
    """Connection ``conn`` is ``node``'s from now on."""

    node: int
    conn: int


class TurnAway(NamedTuple):
    """Close connection ``conn`` without a word back."""

    conn: int


class SendSpec(NamedTuple):
    """Agent ``node``'s spec: its own node rank's, or (a hot spare taking a lost node's place, issue 23) node
    ``node_rank``'s with the spare's host; ``standby``: a spare's first spec, for its preflight only."""

    node: int
    pick_master_port: bool
    master_port: int = 0  # node 0: rank 0's port to check (given) or to try first (picking); 0: none
    node_rank: int | None = None  # None: the agent's own (``node``)
    standby: bool = False
    # --replica_groups: the lost node's groups start again on this spare, each from its restarts ((group, count), ...)
    group_restarts: tuple[tuple[int, int], ...] = ()


class SendAccept(NamedTuple):
    """Pod mode: the node's hello is admitted; it runs its own command line, no spec is sent."""

    node: int


class SendStart(NamedTuple):
    nodes: tuple[int, ...]
    master_addr: str
    master_port: int | None
    attempt: int = 0  # --max_restarts: the ranks' TORCHELASTIC_RESTART_COUNT


class SendRestart(NamedTuple):
    """--max_restarts: every node's agent (each done with the attempt before) prepares attempt ``attempt`` and says
    ready again; node 0 checks or picks rank 0's port as at the first barrier."""

    nodes: tuple[int, ...]
    attempt: int
    pick_master_port: bool
    master_port: int  # node 0's: the given port to check, or 0 (picking: a fresh one)
    node0: int = 0  # the agent that runs node 0 (a hot spare's, once one took its place)


class SendStop(NamedTuple):
    nodes: tuple[int, ...]
    signal: int
    deadline: float  # the agents' own shutdown deadline, seconds
    reason: str


class RunPrecheck(NamedTuple):
    """--precheck (issue 24): every node is ready; run the network check across ``nodes`` before any rank starts
    (each node's interface is the one toward ``toward``, the master address)."""

    nodes: tuple[int, ...]  # the agents: the world's nodes' and the hot spares' on standby (--spares)
    toward: str
    hosts: tuple[str, ...]  # each agent's host, as the job names it


class SendPing(NamedTuple):
    nodes: tuple[int, ...]


class Drop(NamedTuple):
    """Close ``node``'s connection (the node is lost)."""

    node: int


class ShowLine(NamedTuple):
    text: str


class ShowJoined(NamedTuple):
    host: str
    ready: int
    total: int


class ShowWaiting(NamedTuple):
    ready: int
    missing: tuple[str, ...]
    elapsed: float


class ShowStarted(NamedTuple):
    nodes: int
    ranks: int
    elapsed: float
    master_addr: str
    master_port: int | None


class GroupsMoved(NamedTuple):
    """--replica_groups: the groups of node ``node_rank`` (lost: ``reason``) start again on the hot spare ``spare``;
    each is a restart of its budget, recorded as the group's ``group_restarted``."""

    node_rank: int
    lost: str
    spare: str
    reason: str
    moves: tuple["GroupMove", ...]


class SendGroupOrder(NamedTuple):
    """--replica_groups: to the agents ``nodes``, holding ranks of the group across nodes ``group``: stop them
    (``restart`` None), or start them again as the group's ``restart``-th."""

    nodes: tuple[int, ...]
    group: int
    restart: int | None = None
    master_addr: str | None = None  # a start after a hot spare took the group's leading node: its address


class GroupRestartedAcross(NamedTuple):
    """--replica_groups: the head restarts a group across nodes (the failed rank on ``host``; its nodes ``hosts``),
    recorded as the group's ``group_restarted``."""

    host: str
    hosts: tuple[str, ...]
    restart: "GroupRestart"


class SendVerdict(NamedTuple):
    """Pod mode: how the job ended, to every node still connected (each exits with its code)."""

    nodes: tuple[int, ...]
    verdict: "Verdict"


Action = Union[
    Admit, TurnAway, SendSpec, SendAccept, SendStart, SendRestart, SendStop, SendPing, SendVerdict, Drop, ShowLine,
    ShowJoined, ShowWaiting, ShowStarted, RunPrecheck, GroupsMoved, SendGroupOrder, GroupRestartedAcross,
]

# -- the outcome ----------------------------------------------------------------------------------------------


class Failure(NamedTuple):
    """The first thing that went wrong: a rank's exit, or a node-level problem (rank is None)."""

    host: str
    reason: str
    exit_code: int
    rank: int | None = None
    tail: tuple[str, ...] = ()
    final: bool = False  # no restart mends it (a refused node, a busy --master_port, --hang_action stop)


class Verdict(NamedTuple):
    """How the job ended, decided once every node is over."""

    exit_code: int
    failure: Failure | None = None  # the root cause (the first failure)
    interrupted_by: int | None = None  # the signal that stopped the job, if one did
    stopped_after: float | None = None  # seconds from the first failure until every node was over
    attempts: tuple["Attempt", ...] = ()  # --max_restarts: every attempt, the last one included
    restart_lines: tuple[str, ...] = ()  # why the restarts ended and each attempt's root cause
    lost_ranks: tuple[int, ...] = ()  # --on_rank_exit keep: the ranks that failed while others ran on


class Attempt(NamedTuple):
    """One attempt of a job with --max_restarts (xrun.runner.job.attempts), as the report and summary.json show it."""

    number: int  # 0 for the first run: the ranks' TORCHELASTIC_RESTART_COUNT
    began_at: float  # seconds since the job began: the attempt's barrier opened
    ran_s: float  # from its ranks' start (or its beginning, when they never started) to its first failure
    failure: Failure | None
    ended_at: float | None = None  # seconds since the job began: every node of the attempt was over
    replaced: tuple["Replacement", ...] = ()  # --spares: the lost nodes hot spares took the places of, before it

    def to_json(self) -> dict[str, object]:
        failure = self.failure
        return {
            "attempt": self.number,
            "began_at_s": round(self.began_at, 3),
            "ran_s": round(self.ran_s, 3),
            "ended_at_s": None if self.ended_at is None else round(self.ended_at, 3),
            "root_cause": None if failure is None else failure.reason,
            "host": None if failure is None else failure.host,
            "rank": None if failure is None else failure.rank,
            "exit_code": None if failure is None else failure.exit_code,
            "replaced": [r.to_json() for r in self.replaced],
        }


class Replacement(NamedTuple):
    """--spares (issue 23): the spare ``spare`` runs node ``node_rank`` in place of the lost ``lost`` from
    ``attempt`` on (same node rank, same slots); ``lost`` is not used again by the job."""

    node_rank: int
    lost: str
    spare: str
    attempt: int

    def to_json(self) -> dict[str, object]:
        return {"node_rank": self.node_rank, "lost_host": self.lost, "spare_host": self.spare, "attempt": self.attempt}

    def line(self) -> str:
        return f"{self.spare} in place of {self.lost} (node {self.node_rank})"


def _typed_equality() -> None:
    """Equal means the same type and fields, as a dataclass's ``==``: the machine's tests compare whole action lists,
    where ``Drop(3)`` must not pass for ``Admit(3)``. The hash stays the tuple's (equal records hash alike)."""

    def eq(self: object, other: object) -> bool:
        return type(self) is type(other) and isinstance(self, tuple) and tuple.__eq__(self, other) is True

    def ne(self: object, other: object) -> bool:
        return not eq(self, other)

    for record in list(globals().values()):
        if isinstance(record, type) and issubclass(record, tuple) and record.__module__ == __name__:
            record.__eq__ = eq  # type: ignore[method-assign]
            record.__ne__ = ne  # type: ignore[method-assign]


_typed_equality()
