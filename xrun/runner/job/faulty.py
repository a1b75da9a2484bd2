"""Nodes found bad (``xrun.runner.job.machine``, issue 24): ``--precheck``'s result and ``NodesFaulty``.

While the start barrier holds, each bad node is replaced at once by a hot spare on standby (issue 23): not a
restart, no rank has started; the spare is sent the node's spec and the barrier waits for its preflight and ready.
Without enough spares, or once the ranks run, bad nodes are lost nodes: the job stops, and with ``--max_restarts``
the next attempt runs on spares or the job ends naming every lost node (``xrun.runner.job.restart``). Which nodes a
precheck finds bad, and which spares may take their places, is ``xrun.runner.network.precheck_decision``'s decision.

Pure: the machine feeds the state, these change it and queue its actions.
"""

from __future__ import annotations

from xrun.runner.job.attempts import seated_specs
from xrun.runner.job.events import Failure, NodesFaulty, PrecheckDone
from xrun.runner.job.nodes import Node
from xrun.runner.job.verdict import lost_failure
from xrun.runner.job.view import JobView
from xrun.runner.network.precheck_decision import decide_with_spares, passed_line


def precheck_done(job: JobView, event: PrecheckDone) -> None:
    """--precheck is over (before any attempt: the first, or a restart's): the ranks start, hot spares that passed
    take bad nodes' places, or the job ends, as ``precheck.decide_with_spares`` says."""
    if job.stop.stopping:
        return  # a node was lost or a signal came meanwhile: the job is ending already
    standing, attempt = job.spares.ready(), job.attempts.number
    bad_spares, outcome = decide_with_spares(event.result, world=job.nodes.by_agent, spares=[s.agent for s in standing],
                                             attempt=attempt)
    for bad in bad_spares:
        spare = job.spares.standing.get(bad.rank)
        if spare is not None:
            job._out += job.spares.lose(spare, f"precheck: {bad.describe()}")
    if outcome is None:
        job._out += job.barrier.precheck_passed(passed_line(event.result, attempt=attempt), job.now)
    elif isinstance(outcome, Failure):
        job._fail(outcome)
    else:
        job._say(outcome.line)
        replace_now(job, [(job.nodes.by_agent[node], spare) for node, spare in outcome.pairs])
        job.barrier.reopen(job.now)


def nodes_faulty(job: JobView, event: NodesFaulty) -> None:
    """These nodes are bad (the seam for any check before the start): replaced by spares on standby while the
    barrier holds and there are enough, else lost."""
    nodes = job.nodes
    bad = [nodes[r] for r in dict.fromkeys(event.node_ranks) if 0 <= r < len(nodes) and not nodes[r].over]
    standing = job.spares.ready()
    if job.barrier.holding(stopping=job.stop.stopping) and len(bad) <= len(standing):
        replace_now(job, [(node, spare.agent) for node, spare in zip(bad, standing)])
        return
    for node in bad:
        job._out += job.stop.mark_lost(node, event.reason)
    if bad:
        job._fail(lost_failure(", ".join(n.host for n in bad), event.reason))


def replace_now(job: JobView, pairs: list[tuple[Node, int]]) -> None:
    """Before any rank of the attempt started: each spare (an agent id) runs its node from now on, and is sent the
    node's spec (its preflight and ready follow; the barrier holds until then)."""
    for node, spare in pairs:
        replacement, actions = job.spares.seat(job.nodes, node, job.attempts.number, spare)
        job.attempts.replaced += (replacement,)
        job._out += actions
    job._out += seated_specs(job.config, [node for node, _ in pairs])
