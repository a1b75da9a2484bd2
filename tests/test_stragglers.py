"""Every rank's straggler score (issue 31): lateness after the others' median, clock offsets from the pings,
the rule that names a straggler and its recovery, and a healthy job's jitter never named. Pure: fabricated
samples.
"""

from __future__ import annotations

import random
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.common.result.stragglers import (
    SAME_CLOCK,
    ClockOffset,
    ClockOffsets,
    StragglerScores,
    _medians_without,
)
from xrun.common.telemetry.records import EntryTimes, GroupTimes

T0 = 1_795_860_000_000_000_000
MS = 1_000_000


def samples(seqs: range, late: dict[int, int], ranks: range, *, skew: int = 0,
            jitter: random.Random | None = None) -> list[EntryTimes]:
    """Each rank's entry into ``seqs``, every 100 ms; rank r enters late[r] ns after the rest (its clock + skew)."""
    out = []
    for rank in ranks:
        times = tuple(T0 + seq * 100 * MS + late.get(rank, 0) + skew
                      + (jitter.randrange(0, 3 * MS) if jitter else 0) for seq in seqs)
        out.append(EntryTimes(rank, (GroupTimes("0", tuple(seqs), times),)))
    return out


def feed(scores: StragglerScores, late: dict[int, int], *, batches: int, start: int = 1, ranks: range = range(4),
         jitter: random.Random | None = None) -> list[str]:
    lines = []
    for b in range(batches):
        seqs = range(start + 8 * b, start + 8 * b + 8)
        lines += scores.add("node0", SAME_CLOCK, samples(seqs, late, ranks, jitter=jitter))
    return lines


def test_a_rank_that_sleeps_before_each_collective_is_named_then_recovers():
    scores = StragglerScores()
    lines = feed(scores, {2: 210 * MS}, batches=4)
    assert lines == ["straggler: rank 2 (node0) enters collectives 210 ms after the others' median in 100% of its "
                     "last 16 (others wait for it)"]
    assert scores.status() == "straggler: rank 2 (node0) +210 ms"
    assert feed(scores, {}, batches=1, start=33) == []  # 8 of its last 16 late: 50%, not yet below 25%
    assert feed(scores, {}, batches=1, start=41) == [  # decided once the node's sample is scored
        "straggler: rank 2 (node0) recovered: late in 0% of its last 16 collectives"]
    assert scores.status() is None
    two = {s.rank: s for s in scores.scores()}[2]
    assert (two.scored, two.late, two.last) == (48, 32, 32)


def test_a_healthy_jobs_jitter_names_no_one():
    scores = StragglerScores()
    assert feed(scores, {}, batches=40, jitter=random.Random(7)) == []
    assert all(not s.straggler and s.late == 0 for s in scores.scores())


def test_two_ranks_the_late_one_is_late_by_the_whole_gap():
    scores = StragglerScores()
    feed(scores, {1: 50 * MS}, batches=2, ranks=range(2))
    by_rank = {s.rank: s for s in scores.scores()}
    assert by_rank[1].median_lateness_ms == 50.0 and by_rank[0].median_lateness_ms == -50.0


def test_a_node_whose_clock_runs_ahead_is_corrected_by_its_offset():
    scores = StragglerScores(world_size=4)
    for b in range(4):
        seqs = range(1 + 8 * b, 9 + 8 * b)
        scores.add("a", SAME_CLOCK, samples(seqs, {}, range(2)))
        # node b's clock is 2 s ahead of the head's; it knows so within 0.2 ms
        scores.add("b", ClockOffset(2_000 * MS, MS // 5), samples(seqs, {}, range(2, 4), skew=2_000 * MS))
    assert [s.late for s in scores.scores()] == [0, 0, 0, 0] and scores.status() is None
    assert [s.scored for s in scores.scores()] == [32] * 4


def test_no_clock_estimate_no_score():
    scores = StragglerScores()
    assert scores.add("b", None, samples(range(1, 9), {1: 500 * MS}, range(2))) == []
    assert scores.scores() == ()


def test_a_collective_is_scored_once_every_rank_reported_it_and_once_only():
    scores = StragglerScores(world_size=4)
    scores.add("a", SAME_CLOCK, samples(range(1, 9), {}, range(2)))
    assert [s.scored for s in scores.scores()] == [0, 0]  # ranks 2-3 have not reported it yet
    scores.add("b", SAME_CLOCK, samples(range(1, 9), {}, range(2, 4)))
    scores.add("a", SAME_CLOCK, samples(range(1, 9), {}, range(2)))  # the next sample overlaps
    assert [s.scored for s in scores.scores()] == [8, 8, 8, 8]


def test_clock_offsets_from_pings():
    offsets = ClockOffsets()
    offsets.sent("b", 1_000)
    offsets.pong("b", 1_400, 5_000_000)  # round trip 400 ns, node's clock at the midpoint: 5,000,000 - 1,200
    offsets.sent("b", 10_000)
    offsets.pong("b", 30_000, 9_999_999)  # a slower trip: not the one chosen
    assert offsets.of("b") == ClockOffset(5_000_000 - 1_200, 201)
    assert offsets.of("c") is None
    offsets.pong("c", 5, 5)  # a pong without a ping is ignored
    assert offsets.of("c") is None


_sample = st.builds(EntryTimes, rank=st.integers(0, 6), groups=st.lists(st.builds(
    lambda name, pairs: GroupTimes(name, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)),
    st.sampled_from(["0", "1"]), st.lists(st.tuples(st.integers(0, 40), st.integers(0, 10**19)), max_size=12)),
    max_size=2).map(tuple))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.none() | st.builds(ClockOffset, st.integers(-10**12, 10**12),
                                                                            st.integers(0, 10**9)),
                          st.lists(_sample, max_size=4)), max_size=8))
def test_any_samples_give_scores_never_a_crash(batches):
    scores = StragglerScores()
    for host, offset, batch in batches:
        assert all(isinstance(line, str) for line in scores.add(host, offset, batch))
    for score in scores.scores():
        assert 0 <= score.late <= score.scored and 0 <= score.last <= score.scored
    scores.to_json()
    scores.status()


@given(st.lists(st.integers(0, 10**6), min_size=2, max_size=30))
def test_the_others_median_is_one_of_three_values(values):
    times = sorted(values)
    (low, a), (middle, b), high = _medians_without(times)
    for index in range(len(times)):
        others = times[:index] + times[index + 1 :]
        expected = round(statistics.median(others))
        assert (low if index <= a else middle if index <= b else high) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 300 * MS), min_size=2, max_size=40), st.integers(0, 5 * MS))
def test_the_late_ones_are_those_past_the_threshold_after_the_others_median(entered, uncertainty):
    """The scoring finds the late ranks as the tail of the lateness (ascending by entry): the same ranks as
    comparing each with the median of the others."""
    scores = StragglerScores(world_size=len(entered))
    samples_ = [EntryTimes(rank, (GroupTimes("0", (7,), (T0 + t,)),)) for rank, t in enumerate(entered)]
    scores.add("node0", ClockOffset(0, uncertainty), samples_)
    threshold = 10 * MS + 2 * uncertainty
    expected = {rank for rank, t in enumerate(entered)
                if t - round(statistics.median(entered[:rank] + entered[rank + 1 :])) >= threshold}
    assert {s.rank for s in scores.scores() if s.late} == expected
