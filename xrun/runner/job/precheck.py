"""``--precheck`` (issue 24): the one decision about what the network check across a job's nodes found (its result
is data: ``xrun.runner.network.report.PrecheckResult``, each bad node's rank, host, verdict, reason and figures).
Pure: no socket, no clock.

The check itself is ``xrun check --network``'s (``xrun.runner.network``: the same rounds, the same verdict rules),
run over the job's own connected agents once every node is through the start barrier and before any rank starts
(``xrun.runner.job.precheck_run`` drives it; the barrier holds meanwhile: ``xrun.runner.job.barrier``).

``decide`` is the one place that says what a bad node means for the job. Today: the job ends before any rank
starts (exit 1), naming every bad node with its figures. Hot spares (``--spares``) plug in here: a result whose
bad nodes can be replaced by spares that passed becomes "replace them" instead of "end the job".
"""

from __future__ import annotations

from xrun.runner.job.events import Failure
from xrun.runner.job.verdict import NODE_FAILURE_EXIT
from xrun.runner.network.report import PrecheckResult


def decide(result: PrecheckResult) -> Failure | None:
    """What the job does about the precheck: None, the ranks start; a ``Failure``, the job ends before any rank
    starts, naming every bad node and its figures (final: a restart on the same nodes would meet the same node).
    The spares work changes this one function (see the module doc)."""
    bad = result.bad
    if not bad:
        return None
    named = "; ".join(node.describe() for node in bad)
    reason = f"precheck: {len(bad)} of {len(result.rows)} node(s) bad, no rank started: {named}"
    return Failure(", ".join(node.row.host for node in bad), reason, NODE_FAILURE_EXIT, final=True)


def passed_line(result: PrecheckResult) -> str:
    """The one line a healthy precheck leaves."""
    rates = sorted(r.result.figures.throughput_mbs for r in result.rows if r.result.figures is not None)
    median = f", median {rates[len(rates) // 2]:.1f} MB/s" if rates else ""
    return f"precheck passed: {len(result.rows)} node(s) ok in {result.elapsed:.1f} s{median}"
