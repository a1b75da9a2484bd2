"""The machine's restart (``xrun.runner.job.machine``, issue 23): once every node of an attempt is over, the next
attempt begins, waits for nodes still joining, or the job ends.

What follows an attempt is ``xrun.runner.job.attempts``'s rule (shared with the local backend); here the machine
acts on it. A lost node (or one that failed its preflight) may have its place taken by a hot spare on standby
(``xrun.runner.job.spares``); in pod mode a lost node other than node 0 may come back instead
(``xrun.runner.job.rejoin``). A failure within ``--join_timeout`` of the job's start, while nodes (or, short of
spares, spares) are still joining, waits for them: they join the next attempt. The next attempt gets every node
back, a fresh root cause, no stop, and a new start barrier.

Pure: the machine feeds the state, these change it and queue its actions.
"""

from __future__ import annotations

from xrun.runner.job.attempts import Ending, restart_actions
from xrun.runner.job.barrier import Barrier
from xrun.runner.job.nodes import NodeState
from xrun.runner.job.rejoin import rejoins, unawaited_nodes
from xrun.runner.job.view import JobView


def restarted(job: JobView) -> bool:
    """--max_restarts: the attempt just over is followed by another, or waits for nodes and spares still joining
    to decide."""
    if not job.config.restart.restarts:
        return False
    # lost, or failed its preflight: a spare on standby may take its place (pod mode: a lost node other than
    # node 0 may come back instead, xrun.runner.job.rejoin)
    faulty = unawaited_nodes(job.nodes, job.config) if rejoins(job.config) else job.nodes.faulty()
    if faulty and _joining(job, short=len(faulty) > len(job.spares.ready())):
        return True  # not over yet: decided once they joined (or stand by) or are lost, at the latest a tick
    ending = job.attempts.over(job.cause, job.barrier.started_at, job.now,
                               lost=tuple(n.host for n in faulty), spares=len(job.spares.ready()))
    if ending is not Ending.RESTART:
        return False
    attempt = job.attempts.begin_next(job.now)
    job.attempts.replaced, seating = job.spares.seat_all(job.nodes, faulty, attempt)
    job._out += seating
    job._out += restart_actions(job.config, job.nodes, attempt, job.cause.failure, job.attempts.replaced)
    job.cause.next_attempt()
    job.stop.next_attempt()
    job.barrier = Barrier(job.config, job.nodes, t0=job.now, attempt=attempt, spares=job.spares)  # --precheck
    return True


def _joining(job: JobView, *, short: bool) -> bool:
    """A failure to restart, within --join_timeout of the job's start, while nodes are still to join (they join
    the next attempt) or, ``short`` of spares, spares are still to stand by: what follows waits for them."""
    failure = job.cause.failure
    if failure is None or failure.final or job.cause.interrupted_by is not None or job.config.verdict_to_nodes:
        return False  # pod mode: nodes that join late or come back are xrun.runner.job.rejoin's
    if job.now >= job.attempts.t0 + job.config.join_timeout:
        return False
    return any(n.state is NodeState.WAITING for n in job.nodes) or (short and job.spares.joining())
