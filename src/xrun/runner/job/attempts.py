"""Whole-job restarts (issue 23): when an attempt is over, whether the job starts another one, and its history.

A static job with ``--max_restarts N`` runs in attempts. Once every node of an attempt is over, ``decide`` reads
the attempt's outcome and the attempts before it and answers with an ``Ending``:

* ``RESTART``: a failure the job can retry: every node's agent is still connected, restarts are left, and the
  no-progress rule does not hold;
* ``FINAL``: nothing to retry: the attempt succeeded, a signal stopped it, its failure is not one a restart
  mends (a node refused at its hello, a busy ``--master_port``, a hang under ``--hang_action stop``), or no
  restart was asked for;
* ``NODE_LOST``: a node's agent is gone (or failed its preflight) and no hot spare (``--spares``) can take its
  place; with enough spares on standby, the next attempt runs on them instead (``xrun.runner.job.spares``). With
  ``--spares`` but no ``--max_restarts`` (``--precheck`` alone, issue 33) no spare ever takes a lost node's place:
  the job ends, and its line says which flag would have let one;
* ``EXHAUSTED``: the N restarts are used up;
* ``NO_PROGRESS``: this attempt and the one before it failed the same way (same rank, same exit code, or the
  same node-level cause on the same host) and neither ran ``--min_attempt_s`` seconds from its start to its
  failure: restarting again would only repeat it.

Pure: the caller (``xrun.runner.job.machine``) feeds the times; the local backend uses the same rules.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import Action, Attempt, Failure, Replacement, SendRestart, SendSpec, ShowLine
from xrun.runner.job.nodes import Node, Nodes, NodeState
from xrun.runner.job.verdict import RootCause
from xrun.runner.restart_options import RestartPolicy


class Ending(enum.Enum):
    RESTART = "restart"
    FINAL = "final"
    NODE_LOST = "node lost"
    EXHAUSTED = "exhausted"
    NO_PROGRESS = "no progress"


def same_way(a: Failure | None, b: Failure | None) -> bool:
    """Two failures that look alike: the same rank with the same code, or the same node-level cause's host."""
    if a is None or b is None:
        return False
    if a.rank is not None or b.rank is not None:
        return (a.rank, a.exit_code) == (b.rank, b.exit_code)
    return (a.host, a.exit_code) == (b.host, b.exit_code)


def decide(policy: RestartPolicy, history: Sequence[Attempt], *, interrupted: bool, nodes_missing: int) -> Ending:
    """What follows the last attempt of ``history`` (it is over); ``nodes_missing``: nodes whose agent is gone
    (beyond the spares that could take their places: without restarts, none could)."""
    last = history[-1]
    if last.failure is None or interrupted or last.failure.final:
        return Ending.FINAL
    if nodes_missing:
        return Ending.NODE_LOST
    if not policy.restarts:
        return Ending.FINAL
    if len(history) > policy.max_restarts:
        return Ending.EXHAUSTED
    if no_progress(policy, history):
        return Ending.NO_PROGRESS
    return Ending.RESTART


def no_progress(policy: RestartPolicy, history: Sequence[Attempt]) -> bool:
    """The last two attempts failed the same way, each sooner than ``--min_attempt_s`` after its start."""
    if len(history) < 2 or policy.min_attempt_s <= 0:
        return False
    before, last = history[-2], history[-1]
    short = before.ran_s < policy.min_attempt_s and last.ran_s < policy.min_attempt_s
    return short and same_way(before.failure, last.failure)


def ending_lines(ending: Ending, policy: RestartPolicy, history: Sequence[Attempt], *, lost: Sequence[str] = (),
                 spares: int = 0) -> list[str]:
    """Why the restarts ended, and (after several attempts) each attempt's root cause, one line each; ``lost``:
    the hosts of the nodes lost in the last attempt, ``spares`` the spares that stood by for them."""
    restarts = len(history) - 1
    last = history[-1].failure
    if ending is Ending.EXHAUSTED:
        head = f"{policy.max_restarts} restart(s) exhausted (--max_restarts {policy.max_restarts})"
    elif ending is Ending.NO_PROGRESS:
        head = (f"stopped restarting: no progress: attempts {restarts - 1} and {restarts} failed the same way "
                f"within --min_attempt_s {policy.min_attempt_s:g} s of their start"
                + (f" ({last.reason})" if last is not None else ""))
    elif ending is Ending.NODE_LOST and not policy.restarts:  # --spares with --precheck alone (issue 33)
        return [unreplaced_line(lost, spares)]
    elif ending is Ending.NODE_LOST:
        head = f"stopped restarting after {restarts} restart(s): {lost_nodes(lost)}"
        if policy.spares:  # without --spares (and in pod mode, which has none) there is no standby to speak of
            head += f" and {spares or 'no'} spare(s) on standby to take their places"
    elif restarts:
        head = f"the job ran {len(history)} attempts ({restarts} restart(s))"
    else:
        return []
    return [head, *attempt_lines(history)]


def lost_nodes(lost: Sequence[str]) -> str:
    return f"{len(lost) or 'a'} node(s) lost" + (f" ({', '.join(lost)})" if lost else "")


def unreplaced_line(lost: Sequence[str], spares: int) -> str:
    """Nodes lost in a job with hot spares but no ``--max_restarts``: it ends as without spares; where the spares
    on standby were enough, the flag that would have let them take the lost nodes' places."""
    if spares < max(1, len(lost)):
        return f"{lost_nodes(lost)} and {spares or 'no'} spare(s) on standby to take their places"
    return (f"{lost_nodes(lost)} and {spares} spare(s) on standby: without --max_restarts a spare takes only the "
            "place of a node --precheck finds bad before the start; give --max_restarts N to let one take a lost "
            "node's place at a restart")


def attempt_lines(history: Sequence[Attempt]) -> list[str]:
    return [f"  attempt {a.number} ({a.ran_s:.1f} s): {a.failure.reason if a.failure else 'succeeded'}"
            + (f" (on {', '.join(r.line() for r in a.replaced)})" if a.replaced else "") for a in history]


class Attempts:
    """The job's attempts so far: the current one's number and beginning, the history of those over."""

    def __init__(self, policy: RestartPolicy, *, t0: float, groups: bool = False) -> None:
        self.policy = policy
        self.groups = groups  # --replica_groups: a lost node's failure says itself why no spare took its groups
        self.t0 = t0
        self.number = 0
        self.began = t0
        self.history: list[Attempt] = []
        self.ending: Ending | None = None
        self.replaced: tuple[Replacement, ...] = ()  # the current attempt's: spares in lost nodes' places
        self.lost: tuple[str, ...] = ()  # the last attempt's lost nodes' hosts, and the spares that stood by
        self.spares = 0

    def over(self, cause: RootCause, started_at: float | None, now: float, *, lost: tuple[str, ...] = (),
             spares: int = 0) -> Ending:
        """The current attempt is over (every node is): record it, and the history ``cause``'s verdict carries;
        what follows. ``started_at``: when its ranks were told to start (None: never); ``lost``: the hosts of the
        nodes whose agent is gone, ``spares``: the spares on standby to take their places."""
        start = started_at if started_at is not None else self.began
        ran = (cause.failure_at if cause.failure_at is not None else now) - start
        self.history.append(Attempt(self.number, self.began - self.t0, max(0.0, ran), cause.failure, now - self.t0,
                                    self.replaced))
        self.lost, self.spares = lost, spares
        replaceable = spares if self.policy.restarts else 0  # without restarts no spare takes a lost node's place
        self.ending = decide(self.policy, self.history, interrupted=cause.interrupted_by is not None,
                             nodes_missing=max(0, len(lost) - replaceable))
        cause.attempts, cause.restart_lines = tuple(self.history), self.lines()
        return self.ending

    def begin_next(self, now: float) -> int:
        self.number += 1
        self.began = now
        self.replaced = ()
        return self.number

    def lines(self) -> tuple[str, ...]:
        if self.ending is None or not self.history or (self.groups and self.ending is Ending.NODE_LOST):
            return ()
        return tuple(ending_lines(self.ending, self.policy, self.history, lost=self.lost, spares=self.spares))


def restart_actions(config: JobConfig, nodes: Nodes, attempt: int, failure: Failure | None,
                    seated: Sequence[Replacement] = ()) -> list[Action]:
    """Every node (each done with the attempt before, still connected) back to JOINED, and told to prepare
    ``attempt``: node 0 checks the given ``--master_port`` again, or picks a fresh port (its first try 0). A node
    whose agent is gone (pod mode: it may come back, xrun.runner.job.machine) waits for its hello at the barrier. A
    node a hot spare took the place of (``seated``) is sent its spec instead: the spare has run nothing yet."""
    for node in nodes:
        node.state = NodeState.JOINED if node.connected else NodeState.WAITING
        node.master_port, node.exit_code = None, None
    reason = failure.reason if failure is not None else "a failure"
    where = " on every node" if len(config.hosts) > 1 else ""  # a one-node job (the local run) is its node
    line = ShowLine(f"restarting the job{where}: attempt {attempt} of {config.restart.max_restarts + 1} "
                    f"(after: {reason})")
    picks = config.pick_master_port or config.master_port == 0
    port = 0 if picks else config.master_port
    fresh = {r.node_rank for r in seated}
    specs = seated_specs(config, [n for n in nodes if n.rank in fresh])
    restart = SendRestart(tuple(n.agent for n in nodes if n.rank not in fresh), attempt, picks, port, nodes[0].agent)
    return [line, restart, *specs]


def seated_specs(config: JobConfig, nodes: Sequence[Node]) -> list[Action]:
    """The spec of each node a hot spare just took the place of, to the spare's agent (node 0's checks or picks
    rank 0's port, as at the first barrier)."""
    picks = config.pick_master_port or config.master_port == 0
    port = 0 if picks else config.master_port
    return [SendSpec(n.agent, picks and n.rank == 0, port if n.rank == 0 else 0, node_rank=n.rank) for n in nodes]
