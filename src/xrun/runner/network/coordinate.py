"""Run the rounds of the network check against any ``Prober`` and name every node's verdict.

Two rounds (``rounds``), each a wave or two of pairs; each pair is measured both ways, one direction after the
other, with every pair of the wave at once. Then every failed probe is settled against a third node
(``node_verdicts.blame``), and a node left without figures (all its partners were bad) gets a pair with a good node of
its own. With N nodes that is 2 rounds x 2 waves at most x 2 directions, plus one batch of settling probes and
one of cover pairs (and, when pairs failed, one wave pairing the nodes still without figures among
themselves, so that a node that cannot connect out does not hide every partner it had): the time does not grow
with N (the probes of a wave run in parallel on different nodes).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from xrun.runner.network import rounds
from xrun.runner.network.node_verdicts import (
    Figures,
    NodeVerdict,
    Probe,
    best_figures,
    blame,
    judge,
    pair_figures,
    speed_order,
)

MEASURE = "measure"
REACH = "reach"
ALLREDUCE = "allreduce"  # --network=allreduce: the pair's all-reduce, once per pair, after its TCP probes


@dataclass(frozen=True)
class Request:
    """``src`` probes ``dst``'s server: ``measure`` (latency and throughput), ``reach`` (connect only) or
    ``allreduce`` (a 2-process all-reduce of ``src`` and ``dst``; ``rate_mbs``: the pair's TCP throughput, which
    sizes the tensor so that a slow link still finishes within the group's bound)."""

    src: int
    dst: int
    mode: str = MEASURE
    rate_mbs: float | None = None


class Prober(Protocol):
    def run(self, requests: Sequence[Request]) -> list[Probe]:
        """Every request's result, in order; requests of different ``src`` run at once, of one ``src`` in turn."""


@dataclass(frozen=True)
class Outcome:
    verdicts: dict[int, NodeVerdict]  # every node's, by the index the prober knows it by


# A check's steps: each yields one batch of requests and is sent back their probes, in order; it returns the outcome.
Steps = Generator[Sequence[Request], Sequence[Probe], Outcome]
_Asks = Generator[Sequence[Request], Sequence[Probe], None]  # a step that returns nothing


class Check:
    """One network check over ``nodes`` (indices the prober knows); ``down`` are nodes that never came up.

    ``run(prober)`` runs it against a ``Prober`` that blocks (``xrun check --network``); ``steps()`` is the same
    check as a generator of request batches, for a caller whose answers arrive as messages (``Stepper``: a job's
    ``--precheck`` over its control channel)."""

    def __init__(self, nodes: Sequence[int], down: Mapping[int, str] | None = None, *,
                 allreduce: bool = False) -> None:
        self._nodes = list(nodes)
        self._allreduce = allreduce
        self._down = dict(down or {})
        self._pairs: list[tuple[tuple[int, int], Figures | None]] = []
        self._probes: list[Probe] = []

    def run(self, prober: Prober) -> Outcome:
        stepper = Stepper(self)
        requests = stepper.first()
        while stepper.outcome is None:
            requests = stepper.answer(prober.run(requests))
        return stepper.outcome

    def steps(self) -> Steps:
        alive = [n for n in self._nodes if n not in self._down]
        if len(alive) >= 2:
            yield from self._round(rounds.neighbour_round(len(alive)), alive)
            order = speed_order(best_figures(self._pairs), alive)
            yield from self._round(rounds.extremes_round(range(len(order))), order)
            yield from self._measure_pairs(rounds.untried_pairs(self._bare(alive), [p for p, _ in self._pairs]))
        unreachable = {**self._down, **(yield from self._settle(alive))}
        if len(alive) < 2:
            unreachable.update({n: "no other node came up to test against" for n in alive})
        yield from self._cover([n for n in alive if n not in unreachable], unreachable)
        return Outcome(judge(best_figures(self._pairs), unreachable, self._nodes))

    def _round(self, round_: rounds.Round, names: Sequence[int]) -> _Asks:
        for wave in round_:
            yield from self._measure_pairs([(names[a], names[b]) for a, b in wave])

    def _measure_pairs(self, pairs: Sequence[tuple[int, int]]) -> _Asks:
        there = yield from self._run([Request(a, b) for a, b in pairs])
        back = yield from self._run([Request(b, a) for a, b in pairs])
        tcp = {pair: pair_figures([x, y]) for pair, x, y in zip(pairs, there, back)}
        reduced: dict[tuple[int, int], Probe] = {}
        if self._allreduce:  # symmetric: one direction per pair, only where TCP passed both ways
            asks = [Request(a, b, ALLREDUCE, f.throughput_mbs) for (a, b), f in tcp.items() if f is not None]
            reduced = {(r.src, r.dst): p for r, p in zip(asks, (yield from self._run(asks)))}
        self._pairs += [(pair, pair_figures([x, y, *([reduced[pair]] if pair in reduced else [])]))
                        for pair, x, y in zip(pairs, there, back)]

    def _run(self, requests: Sequence[Request]) -> Generator[Sequence[Request], Sequence[Probe], list[Probe]]:
        if not requests:
            return []
        found = list((yield requests))
        if len(found) != len(requests):
            raise ValueError(f"{len(requests)} requests were answered with {len(found)} probes")
        self._probes += found
        return found

    def _bare(self, alive: Sequence[int]) -> list[int]:
        best = best_figures(self._pairs)
        return [n for n in alive if n not in best]

    def _helpers(self, alive: Sequence[int]) -> list[int]:
        """Nodes with a pair that passed both ways (so they accept and open connections), fastest first: the
        third nodes that settle a failure."""
        best = best_figures(self._pairs)
        return speed_order(best, [n for n in alive if n in best])

    def _settle(self, alive: Sequence[int]) -> Generator[Sequence[Request], Sequence[Probe], dict[int, str]]:
        """Decide which side of each failed probe is bad (a third node probes both sides)."""
        failures = list({(p.src, p.dst): p for p in self._probes if not p.ok}.values())
        helpers = self._helpers(alive)
        asks: list[tuple[Probe, int | None]] = []
        for i, failure in enumerate(failures):
            third = [h for h in helpers if h not in (failure.src, failure.dst)]
            asks.append((failure, third[i % len(third)] if third else None))
        requests = [r for f, h in asks if h is not None
                    for r in (Request(h, f.dst, REACH), Request(f.src, h, REACH))]
        answers = iter((yield from self._run(requests)))
        named: dict[int, str] = {}
        for failure, helper in asks:
            inbound, outbound = (next(answers), next(answers)) if helper is not None else (None, None)
            for node, reason in blame(failure, inbound, outbound).items():
                named.setdefault(node, reason)
        return named

    def _cover(self, left: Sequence[int], unreachable: dict[int, str]) -> _Asks:
        """A good node that has no figures yet (its partners were all bad) gets a pair with a node that has."""
        helpers = self._helpers([n for n in self._nodes if n not in unreachable])
        pairs = []
        for i, node in enumerate(n for n in left if n not in helpers):
            others = [h for h in helpers if h != node]
            if others:
                pairs.append((node, others[i % len(others)]))
        yield from self._measure_pairs(pairs)


class Stepper:
    """A ``Check`` driven one batch at a time: ``first()``, then ``answer(probes)`` with each batch's probes in
    order; both return the next batch, or ``[]`` once ``outcome`` is set."""

    def __init__(self, check: Check) -> None:
        self._steps = check.steps()
        self.outcome: Outcome | None = None

    def first(self) -> Sequence[Request]:
        return self._advance(None)

    def answer(self, probes: Sequence[Probe]) -> Sequence[Request]:
        if self.outcome is not None:
            raise ValueError("the check is over: no batch is waiting for its probes")
        return self._advance(probes)

    def _advance(self, probes: Sequence[Probe] | None) -> Sequence[Request]:
        try:
            return next(self._steps) if probes is None else self._steps.send(probes)
        except StopIteration as over:
            self.outcome = over.value
            return []
