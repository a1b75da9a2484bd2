"""``--precheck`` (issue 24): the one decision about what the network check across a job's nodes found (its result
is data: ``node_results.PrecheckResult``, each bad node's rank, host, verdict, reason and figures). Pure: no socket,
no clock.

The check itself is ``xrun check --network``'s (the same rounds, the same verdict rules), run over the job's own
connected agents once every node is through the start barrier and before any rank starts, before every attempt of
``--max_restarts`` (``precheck_channel`` drives it; the barrier holds meanwhile: ``xrun.runner.job.barrier``).

``decide`` is the one place that says what a bad node means for the job: it ends before any rank starts
(``NodesBad``, which the job makes its failure: exit 1), naming every bad node with its figures. With hot spares
(``--spares``, issue 23) the spares on standby are checked beside the nodes, and ``decide_with_spares`` comes first:
a bad spare is dropped, and bad nodes that spares which passed can replace are replaced (``Replacing``; the machine
seats them and the barrier waits for them, with no second check) instead of ending the job. What the job then does
(seat the spares, lose the nodes, or end with its failure) is the job's own rule: ``Job._precheck_done`` in
``xrun.runner.job.machine``, which imports this module; nothing here imports the job.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from xrun.runner.network.node_results import BadNode, PrecheckResult


@dataclass(frozen=True)
class NodesBad:
    """Bad nodes no spare replaces: the job ends before any rank (of the attempt) starts, naming them. The job makes
    this its failure (``Job._precheck_done``): node failure's exit code, final (the same nodes would fail again)."""

    hosts: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Replacing:
    """--spares: each bad node's agent and the agent of the spare that passed and takes its place; ``line`` says so."""

    pairs: tuple[tuple[int, int], ...]
    line: str


def decide_with_spares(result: PrecheckResult, *, world: Collection[int], spares: Sequence[int], attempt: int = 0
                       ) -> tuple[tuple[BadNode, ...], NodesBad | Replacing | None]:
    """What the job does with spares checked beside its nodes (``world``: the nodes' agents; ``spares``: the spares'
    on standby, in the order they are used): the bad spares (to drop), and None (the ranks start), ``Replacing``
    (each bad node gets a spare that passed), or ``decide``'s ``NodesBad`` over the nodes alone (too few spares)."""
    bad_spares = tuple(b for b in result.bad if b.rank not in world)
    bad_nodes = [b for b in result.bad if b.rank in world]
    if not bad_nodes:
        return bad_spares, None
    dropped = {b.rank for b in bad_spares}
    passed = [agent for agent in spares if agent in result.ranks and agent not in dropped]
    if len(passed) < len(bad_nodes):
        rows = [(rank, row) for rank, row in zip(result.ranks, result.rows) if rank in world]
        nodes_only = PrecheckResult(tuple(r for r, _ in rows), tuple(row for _, row in rows), result.elapsed)
        return bad_spares, decide(nodes_only, attempt=attempt)
    named = "; ".join(node.describe() for node in bad_nodes)
    line = (f"precheck: {len(bad_nodes)} node(s) bad: {named}; hot spares take their places "
            f"(checked in {result.elapsed:.1f} s)")
    return bad_spares, Replacing(tuple(zip((b.rank for b in bad_nodes), passed)), line)


def decide(result: PrecheckResult, *, attempt: int = 0) -> NodesBad | None:
    """What the job does about the precheck before ``attempt``: None, the ranks start; ``NodesBad``, the job ends
    before any rank (of that attempt) starts, naming every bad node and its figures (final: a restart on the same
    nodes would meet the same node)."""
    bad = result.bad
    if not bad:
        return None
    named = "; ".join(node.describe() for node in bad)
    started = f"no rank of attempt {attempt} started" if attempt else "no rank started"
    reason = f"precheck: {len(bad)} of {len(result.rows)} node(s) bad, {started}: {named}"
    return NodesBad(tuple(node.row.host for node in bad), reason)


def passed_line(result: PrecheckResult, *, attempt: int = 0) -> str:
    """The one line a healthy precheck leaves (at a restart, naming the attempt it was for)."""
    rates = sorted(r.result.figures.throughput_mbs for r in result.rows if r.result.figures is not None)
    median = f", median {rates[len(rates) // 2]:.1f} MB/s" if rates else ""
    before = f" before attempt {attempt}" if attempt else ""
    return f"precheck passed{before}: {len(result.rows)} node(s) ok in {result.elapsed:.1f} s{median}"
