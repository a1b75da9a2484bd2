"""The pairwise rounds of the network check (DLRover's ``--precheck`` scheme), as pure functions.

Round 0 pairs neighbours {0,1}, {2,3}, ...; round 1 sorts the nodes by their round-0 figures and pairs the
fastest with the slowest, the second fastest with the second slowest, and so on, so that a node that was slow
only because of its neighbour gets a fast partner. A round is a tuple of *waves*; the pairs of a wave share no
node and run at once, so a round costs one or two waves whatever the node count. An odd count leaves one node
out of the first wave: it gets a wave of its own, paired with a node that is already covered (round 0: node 0;
round 1: the fastest), so every node is in at least one pair of every round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Pair = tuple[int, int]
Wave = tuple[Pair, ...]
Round = tuple[Wave, ...]


def neighbour_round(count: int) -> Round:
    """Round 0 over nodes 0..count-1: {0,1}, {2,3}, ...; an odd last node then pairs with node 0."""
    if count < 2:
        raise ValueError(f"a network check needs at least 2 nodes, not {count}")
    wave = tuple((i, i + 1) for i in range(0, count - 1, 2))
    return (wave, ((count - 1, 0),)) if count % 2 else (wave,)


def extremes_round(order: Sequence[int]) -> Round:
    """Round 1 over ``order`` (fastest first): fastest with slowest, inward; an odd middle node pairs with the
    fastest in a wave of its own."""
    count = len(order)
    if count < 2:
        raise ValueError(f"a network check needs at least 2 nodes, not {count}")
    wave = tuple((order[i], order[count - 1 - i]) for i in range(count // 2))
    return (wave, ((order[count // 2], order[0]),)) if count % 2 else (wave,)


def untried_pairs(nodes: Sequence[int], tried: Iterable[tuple[int, int]]) -> list[Pair]:
    """One wave pairing ``nodes`` among themselves, greedily, never a pair already tried (after failures: two
    good nodes that were each paired only with a bad one still get to prove themselves)."""
    seen = {frozenset(pair) for pair in tried}
    free = list(nodes)
    wave = []
    while free:
        a = free.pop(0)
        b = next((x for x in free if frozenset((a, x)) not in seen), None)
        if b is not None:
            free.remove(b)
            wave.append((a, b))
    return wave
