"""Many ranks' collective records as findings (issue 31): the collective a hung job waits in and the rank that
never entered it, mismatches, ranks without a record. Pure: fabricated records, and any records at all (never a
crash).
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.common.result.collectiveview import MismatchKind, find_hang
from xrun.common.telemetry.records import Collective, GroupState, RankCollectives

T0 = 1_795_860_000_000_000_000


def call(seq: int, *, op: str = "all_reduce", size: tuple[int, ...] = (4096,), dtype: str = "Float",
         done: bool = True) -> Collective:
    sizes = (size,) if size else ()
    dtypes = (dtype,) if size else ()
    return Collective(seq, op, sizes, dtypes, sizes, dtypes, "scheduled", done, T0 + seq)


def history(last: int, *, waiting: bool = True, **kw: object) -> tuple[Collective, ...]:
    """The last four collectives up to ``last``; the last one not completed when ``waiting``."""
    return tuple(call(s, done=not (waiting and s == last), **kw)  # type: ignore[arg-type]
                 for s in range(max(1, last - 3), last + 1))


def rank(n: int, recent: tuple[Collective, ...] = (), *, host: str = "node0", where: str | None = None,
         groups: tuple[GroupState, ...] = ()) -> RankCollectives:
    default = (GroupState("0", "default_pg", recent),) if recent else ()
    return RankCollectives(host, n, default + groups, where=where)


def test_the_rank_that_never_entered_is_named_with_its_place():
    records = [rank(r, history(1204), host=f"node{r // 2}", where="train.py:72 step") for r in range(7)]
    records.append(rank(7, history(1203, waiting=False), host="node3", where="train.py:88 evaluate"))
    findings = find_hang(records)
    assert findings.root_cause == ("all_reduce #1204 on the default group ([4096] float32): ranks 0-6 wait in it; "
                                   "rank 7 (node3) never entered — at train.py:88 evaluate")
    assert findings.mismatches == ()
    stuck = findings.stuck[0]
    assert (stuck.seq, stuck.waiting, [a.rank for a in stuck.absent]) == (1204, tuple(range(7)), [7])
    assert stuck.absent[0].last_seq == 1203


def test_a_rank_that_never_entered_any_collective_is_absent_from_the_default_group():
    records = [rank(0, history(1)), rank(1, history(1)), rank(2, where="train.py:10 <module>")]
    assert find_hang(records).root_cause == (
        "all_reduce #1 on the default group ([4096] float32): ranks 0-1 wait in it; rank 2 (node0) never entered"
        " — at train.py:10 <module>")


def test_a_healthy_snapshot_finds_nothing():
    records = [rank(r, history(50, waiting=False)) for r in range(4)]
    assert find_hang(records).lines() == []
    # one rank read a moment before the others entered #51, which had completed: nothing held
    ahead = [rank(r, history(51, waiting=False)) for r in range(3)] + [rank(3, history(50, waiting=False))]
    assert find_hang(ahead).lines() == []


def test_every_rank_in_it_none_completed():
    records = [rank(r, history(9)) for r in range(3)]
    assert find_hang(records).lines() == [
        "all_reduce #9 on the default group ([4096] float32): ranks 0-2 all wait in it"]


def test_a_barrier_where_the_others_all_reduce_is_a_mismatch_and_the_root_cause():
    records = [rank(r, history(4)) for r in range(3)]
    records.append(rank(3, history(3, waiting=False) + (call(4, op="barrier", size=(), done=False),)))
    findings = find_hang(records)
    assert [m.kind for m in findings.mismatches] == [MismatchKind.OP]
    assert findings.root_cause == ("#4 on the default group: ranks in different collectives: ranks 0-2 in "
                                   "all_reduce ([4096] float32), rank 3 in barrier")
    assert findings.lines()[1] == "all_reduce #4 on the default group ([4096] float32): ranks 0-3 all wait in it"


def test_sizes_and_dtypes_that_differ_are_named():
    sizes = [rank(r, (call(7, done=False),)) for r in range(2)] + [rank(2, (call(7, size=(4095,), done=False),))]
    assert find_hang(sizes).mismatches[0].line() == (
        "all_reduce #7 on the default group with different sizes: ranks 0-1 [4096] float32, rank 2 [4095] float32")
    dtypes = [rank(0, (call(7, done=False),)), rank(1, (call(7, dtype="BFloat16", done=False),))]
    assert find_hang(dtypes).mismatches[0].line() == (
        "all_reduce #7 on the default group with different dtypes: rank 0 [4096] float32, rank 1 [4096] bfloat16")


def test_all_to_all_sizes_may_differ():
    records = [rank(r, (call(3, op="all_to_all", size=(r + 1,), done=False),)) for r in range(3)]
    assert find_hang(records).mismatches == ()


def test_a_rank_that_waits_in_another_group_does_not_lead():
    tp = GroupState("1", "tp", (call(12, op="broadcast", done=False),))
    tp_peer = GroupState("1", "tp", (call(11, op="broadcast"),))
    records = [rank(0, history(30)), rank(1, history(30)),
               rank(2, history(29, waiting=False), groups=(tp,), host="node1"),
               rank(3, history(29, waiting=False), groups=(tp_peer,), host="node1", where="train.py:50 load")]
    lines = find_hang(records).lines()
    assert lines[0] == ("broadcast #12 on group 1 (tp) ([4096] float32): rank 2 waits in it; rank 3 (node1) never "
                        "entered — at train.py:50 load")
    assert lines[1] == ("all_reduce #30 on the default group ([4096] float32): ranks 0-1 wait in it; rank 2 (node1) "
                        "never entered — waits in broadcast #12 on group 1; rank 3 (node1) never entered — at "
                        "train.py:50 load")


def test_ranks_without_a_record_are_named_with_why():
    records = [rank(0, history(5)), rank(1, history(5)),
               RankCollectives("node1", 2, problem="no answer in 2 s")]
    findings = find_hang(records, world_size=4)
    assert findings.lines() == [
        "all_reduce #5 on the default group ([4096] float32): ranks 0-1 wait in it; ranks 2-3 sent no record",
        "no collective record from ranks 2-3: no answer in 2 s; no record came back (it had exited, or its node did "
        "not answer)"]


def test_the_group_counter_says_completed_when_the_entry_does_not():
    behind = GroupState("0", "default_pg", (call(8, done=False),), last_completed=8)
    records = [rank(0, (call(9, done=True),)), RankCollectives("node0", 1, (behind,))]
    assert find_hang(records).lines() == []


def test_findings_are_json():
    records = [rank(r, history(3)) for r in range(2)] + [rank(2, history(2, waiting=False))]
    data = json.loads(json.dumps(find_hang(records).to_json()))
    assert data["stuck"][0]["absent"][0]["rank"] == 2 and data["root_cause"].startswith("all_reduce #3")


_collective = st.builds(
    Collective, seq=st.integers(0, 20), op=st.sampled_from(["all_reduce", "barrier", "all_to_all", "gather", "é"]),
    in_sizes=st.lists(st.tuples(st.integers(0, 9)), max_size=5).map(tuple),
    in_dtypes=st.lists(st.sampled_from(["Float", "BFloat16", "x"]), max_size=6).map(tuple),
    out_sizes=st.lists(st.tuples(st.integers(0, 9)), max_size=3).map(tuple),
    out_dtypes=st.lists(st.sampled_from(["Float", "Long"]), max_size=3).map(tuple),
    state=st.sampled_from(["scheduled", "started", "completed", ""]), retired=st.booleans(),
    created_ns=st.integers(0, 10**19))
_group = st.builds(GroupState, name=st.sampled_from(["0", "1", "2", "x", "²"]), desc=st.text(max_size=5),
                   recent=st.lists(_collective, max_size=4).map(tuple),
                   last_enqueued=st.none() | st.integers(0, 30), last_completed=st.none() | st.integers(0, 30))
_record = st.builds(RankCollectives, host=st.text(max_size=6), rank=st.integers(0, 12),
                    groups=st.lists(_group, max_size=3).map(tuple), where=st.none() | st.text(max_size=8),
                    problem=st.none() | st.text(max_size=8))


@settings(max_examples=300, deadline=None)
@given(st.lists(_record, max_size=10), st.none() | st.integers(0, 16))
def test_any_records_give_findings_never_a_crash(records, world_size):
    findings = find_hang(records, world_size=world_size)
    lines = findings.lines()
    json.dumps(findings.to_json())
    assert all(isinstance(line, str) and line for line in lines)
    assert (findings.root_cause is None) == (not findings.stuck and not findings.mismatches)
    for stuck in findings.stuck:
        assert stuck.waiting and not set(stuck.waiting) & {a.rank for a in stuck.absent}
