"""``--precheck`` (issue 24) as data and one decision: what the network check across a job's nodes found, and what
the job does about it. Pure: no socket, no clock.

The check itself is ``xrun check --network``'s (``xrun.runner.network``: the same rounds, the same verdict rules),
run over the job's own connected agents once every node is through the start barrier and before any rank starts
(``xrun.runner.job.precheck_run`` drives it; the barrier holds meanwhile: ``xrun.runner.job.barrier``).

``decide`` is the one place that says what a bad node means for the job. Today: the job ends before any rank
starts (exit 1), naming every bad node with its figures. Hot spares (``--spares``) plug in here: a result whose
bad nodes can be replaced by spares that passed becomes "replace them" instead of "end the job".
"""

from __future__ import annotations

from dataclasses import dataclass

from xrun.runner.job.events import Failure
from xrun.runner.job.verdict import NODE_FAILURE_EXIT
from xrun.runner.network.report import NodeRow, format_table
from xrun.runner.network.verdict import RULE, Verdict


@dataclass(frozen=True)
class BadNode:
    """A node the check named: its node rank, host, verdict ('slow' or 'unreachable'), why, and its figures."""

    rank: int
    row: NodeRow

    def describe(self) -> str:
        result, figures = self.row.result, self.row.result.figures
        shown = (f"best pair {figures.latency_ms:.3f} ms, {figures.throughput_mbs:.1f} MB/s" if figures
                 else "no pair with it succeeded")
        why = f": {result.reason}" if result.reason else ""
        return f"{self.row.host} {result.verdict.value}{why} ({shown})"


@dataclass(frozen=True)
class PrecheckResult:
    """Every checked node's row (host, interface, address, figures, verdict), by node rank; the check's time."""

    ranks: tuple[int, ...]  # the node ranks checked, in the order of ``rows``
    rows: tuple[NodeRow, ...]
    elapsed: float

    @property
    def bad(self) -> tuple[BadNode, ...]:
        return tuple(BadNode(rank, row) for rank, row in zip(self.ranks, self.rows)
                     if row.result.verdict is not Verdict.OK)

    def table(self) -> list[str]:
        """The check's table (``xrun check --network``'s), to show next to a failure."""
        return format_table(self.rows).splitlines()


def decide(result: PrecheckResult) -> Failure | None:
    """What the job does about the precheck: None, the ranks start; a ``Failure``, the job ends before any rank
    starts, naming every bad node and its figures (final: a restart on the same nodes would meet the same node).
    The spares work changes this one function (see the module doc)."""
    bad = result.bad
    if not bad:
        return None
    named = "; ".join(node.describe() for node in bad)
    reason = f"precheck: {len(bad)} of {len(result.rows)} node(s) bad, no rank started: {named} [rule: {RULE}]"
    return Failure(", ".join(node.row.host for node in bad), reason, NODE_FAILURE_EXIT, final=True)


def passed_line(result: PrecheckResult) -> str:
    """The one line a healthy precheck leaves."""
    rates = sorted(r.result.figures.throughput_mbs for r in result.rows if r.result.figures is not None)
    median = f", median {rates[len(rates) // 2]:.1f} MB/s" if rates else ""
    return f"precheck passed: {len(result.rows)} node(s) ok in {result.elapsed:.1f} s{median}"
