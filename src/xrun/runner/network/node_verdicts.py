"""Which nodes are bad, from the figures of the rounds: pure, tested with literal numbers.

* A pair's figures are the worse of its two directions (a node slowed on ingress is slow only one way).
* Each node keeps its **best** pair over every round: its neighbour's fault must not become its own.
* **slow**: the node's best throughput is below ``SLOW_FRACTION`` (half) of the median of the nodes' bests, or
  its best latency is above ``LATENCY_FACTOR`` (2) x the median best latency + ``LATENCY_FLOOR_MS`` (the floor
  keeps scheduling jitter of sub-millisecond links from counting); with ``--network=allreduce`` also when its
  best all-reduce bandwidth is below ``SLOW_FRACTION`` of the median of the nodes' best all-reduces.
* **unreachable**: when a directed probe ``a -> b`` fails, a third node ``h`` that passed its own probes decides
  which side is bad: ``h -> b`` failing names ``b`` (it refuses connections), ``a -> h`` failing names ``a`` (it
  cannot connect out); without such a node both sides are named.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

SLOW_FRACTION = 0.5
LATENCY_FACTOR = 2.0
LATENCY_FLOOR_MS = 5.0
RULE = (f"slow: best throughput < {SLOW_FRACTION:g} x the median of the nodes' bests (likewise best all-reduce "
        f"bandwidth, with --network=allreduce), or best latency > {LATENCY_FACTOR:g} x the median + "
        f"{LATENCY_FLOOR_MS:g} ms; unreachable: a peer cannot connect to it or it cannot connect to a peer "
        "(a third node decides which side)")


class LinkVerdict(Enum):
    """The network check's word on one node's links (not the job's ``xrun.runner.job.events.Verdict``)."""

    OK = "ok"
    SLOW = "slow"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Probe:
    """One directed probe: ``src``'s client against ``dst``'s server."""

    src: int
    dst: int
    ok: bool
    latency_ms: float | None = None
    throughput_mbs: float | None = None
    error: str = ""
    allreduce_mbs: float | None = None  # --network=allreduce: on the probe that ran the pair's all-reduce


@dataclass(frozen=True)
class Figures:
    latency_ms: float
    throughput_mbs: float
    allreduce_mbs: float | None = None  # None: no all-reduce ran (--network=tcp)


@dataclass(frozen=True)
class NodeVerdict:
    verdict: LinkVerdict
    figures: Figures | None
    reason: str = ""


def pair_figures(probes: Sequence[Probe]) -> Figures | None:
    """The worse of the directions of one pair (TCP both ways, and the all-reduce's probe if it ran); None when any
    probe failed or the TCP figures are missing."""
    latencies = [p.latency_ms for p in probes if p.latency_ms is not None]
    rates = [p.throughput_mbs for p in probes if p.throughput_mbs is not None]
    reduces = [p.allreduce_mbs for p in probes if p.allreduce_mbs is not None]
    if not probes or not all(p.ok for p in probes) or not latencies or not rates:
        return None
    return Figures(max(latencies), min(rates), min(reduces) if reduces else None)


def _best(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def best_figures(pairs: Iterable[tuple[tuple[int, int], Figures | None]]) -> dict[int, Figures]:
    """Each node's best latency and best throughput over the pairs it was in (they may come from two pairs)."""
    best: dict[int, Figures] = {}
    for nodes, figures in pairs:
        if figures is None:
            continue
        for node in nodes:
            old = best.get(node)
            best[node] = figures if old is None else Figures(min(old.latency_ms, figures.latency_ms),
                                                             max(old.throughput_mbs, figures.throughput_mbs),
                                                             _best(old.allreduce_mbs, figures.allreduce_mbs))
    return best


def blame(failure: Probe, inbound: Probe | None, outbound: Probe | None) -> dict[int, str]:
    """Which side of a failed ``failure.src -> failure.dst`` is bad, given a third node's ``inbound`` probe of
    ``dst`` and ``src``'s ``outbound`` probe of that third node (None: no third node to ask)."""
    a, b = failure.src, failure.dst
    named: dict[int, str] = {}
    if inbound is None or outbound is None:
        why = f"{failure.error} (no third node to tell which side)"
        return {a: f"cannot reach node {b}: {why}", b: f"node {a} cannot reach it: {why}"}
    if not inbound.ok:
        named[b] = f"refuses connections: {inbound.error}"
    if not outbound.ok:
        named[a] = f"cannot connect out: {outbound.error}"
    return named


def judge(best: Mapping[int, Figures], unreachable: Mapping[int, str], nodes: Sequence[int]) -> dict[int, NodeVerdict]:
    """Every node's verdict (see the module doc for the rule)."""
    good = [best[n] for n in nodes if n in best and n not in unreachable]
    median_rate = statistics.median(f.throughput_mbs for f in good) if good else 0.0
    median_latency = statistics.median(f.latency_ms for f in good) if good else 0.0
    reduces = [f.allreduce_mbs for f in good if f.allreduce_mbs is not None]
    median_reduce = statistics.median(reduces) if reduces else 0.0
    verdicts = {}
    for node in nodes:
        figures = best.get(node)
        if node in unreachable or figures is None:
            reason = unreachable.get(node, "no pair with it succeeded")
            verdicts[node] = NodeVerdict(LinkVerdict.UNREACHABLE, figures, reason)
        elif figures.allreduce_mbs is not None and figures.allreduce_mbs < SLOW_FRACTION * median_reduce:
            verdicts[node] = NodeVerdict(LinkVerdict.SLOW, figures, f"all-reduce {figures.allreduce_mbs:.1f} MB/s < "
                                         f"{SLOW_FRACTION:g} x median {median_reduce:.1f}")
        elif figures.throughput_mbs < SLOW_FRACTION * median_rate:
            verdicts[node] = NodeVerdict(LinkVerdict.SLOW, figures, f"throughput {figures.throughput_mbs:.1f} MB/s < "
                                         f"{SLOW_FRACTION:g} x median {median_rate:.1f}")
        elif figures.latency_ms > LATENCY_FACTOR * median_latency + LATENCY_FLOOR_MS:
            verdicts[node] = NodeVerdict(LinkVerdict.SLOW, figures, f"latency {figures.latency_ms:.2f} ms > "
                                         f"{LATENCY_FACTOR:g} x median {median_latency:.2f} + {LATENCY_FLOOR_MS:g}")
        else:
            verdicts[node] = NodeVerdict(LinkVerdict.OK, figures)
    return verdicts


def speed_order(best: Mapping[int, Figures], nodes: Sequence[int]) -> list[int]:
    """Fastest first (throughput, then latency); nodes without figures last: round 1's sort."""
    return sorted(nodes, key=lambda n: (n not in best, -best[n].throughput_mbs if n in best else 0.0,
                                        best[n].latency_ms if n in best else 0.0, n))
