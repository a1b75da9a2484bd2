"""The ranks' collective records as they cross the channel (issue 31): torch's Flight Recorder dump summarised,
the ``collectives`` and ``entry_times`` messages round-tripped, and every malformed or oversized one refused.

Pure: the dumps are torch 2.13's format (``fr_trace_json``, as a gloo rank answered it on this machine).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xrun.channel import STOP_STACKS, Kind, decode_body, encode
from xrun.common.telemetry.records import (
    MAX_GROUPS,
    MAX_TENSORS,
    RECENT,
    CollectivesReport,
    EntrySampler,
    RankCollectives,
    collectives_message,
    entry_times_message,
    grid_stride,
    parse_dump,
    parse_left_records,
    picked_per_sample,
    rank_collectives,
    read_collectives,
    read_entry_times,
    where_from_traceback,
    with_failure,
)

T0 = 1_795_860_366_824_675_278


def entry(seq: int, *, op: str = "all_reduce", pg: tuple[str, str] = ("0", "default_pg"), size: int = 4096,
          created: int | None = None, retired: bool = True, tensors: int = 1) -> dict:
    return {"collective_seq_id": seq, "input_dtypes": ["Float"] * tensors, "input_sizes": [[size]] * tensors,
            "is_p2p": False, "op_id": seq, "output_dtypes": ["Float"] * tensors,
            "output_sizes": [[size]] * tensors, "p2p_seq_id": 0, "pg_id": int(pg[0]) if pg[0].isdigit() else 9,
            "process_group": list(pg), "profiling_name": f"gloo:{op}", "record_id": seq - 1, "retired": retired,
            "state": "scheduled", "thread_id": "1", "thread_name": "python",
            "time_created_ns": T0 + seq * 1_000_000 if created is None else created,
            "time_discovered_completed_ns": 0, "time_discovered_started_ns": 0, "timeout_ms": 1800000}


def dump(*entries: dict) -> dict:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {"0": {"last_enqueued_collective": str(max(e["collective_seq_id"] for e in entries)),
                                "last_started_collective": "-1", "last_completed_collective": "-1"}},
            "entries": list(entries)}


TRACEBACK = """Current thread 0x00007f187a7fc6c0 (most recent call first):
  <no Python frame>

Thread 0x00007f189e458b80 (most recent call first):
  File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line 2901 in all_reduce
  File "/job/train.py", line 88 in evaluate
  File "/job/train.py", line 120 in <module>
"""


def test_a_hang_summary_keeps_the_last_collectives_of_each_group_and_where_the_main_thread_is():
    body = json.dumps(dump(*[entry(s) for s in range(1, 7)], entry(1, op="barrier", pg=("1", "evens")),
                           entry(6, retired=False))).encode()
    record = rank_collectives("node3", 7, parse_dump(body), where=where_from_traceback(TRACEBACK))
    assert record.where == "train.py:88 evaluate"
    default = record.group("0")
    assert default is not None and default.desc == "default_pg" and len(default.recent) == RECENT
    assert [c.seq for c in default.recent] == [4, 5, 6, 6] and default.last_enqueued == 6
    assert default.last_completed is None  # torch's "-1"
    last = default.last_entered
    assert last is not None and last.op == "all_reduce" and last.in_sizes == ((4096,),)
    assert last.in_dtypes == ("Float",) and not last.finished
    evens = record.group("1")
    assert evens is not None and evens.desc == "evens" and [c.op for c in evens.recent] == ["barrier"]


def test_point_to_point_entries_are_left_out():
    p2p = {**entry(9, op="send"), "is_p2p": True}
    record = rank_collectives("h", 0, dump(entry(1), p2p))
    [group] = record.groups
    assert [c.seq for c in group.recent] == [1]


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"entries": 3}'])
def test_an_answer_that_is_not_a_dump_is_refused(body):
    with pytest.raises(ValueError, match="Flight Recorder"):
        parse_dump(body)


def test_an_entry_not_in_torchs_format_is_refused():
    bad = {**entry(1), "time_created_ns": "soon"}
    with pytest.raises(ValueError, match="not torch's format"):
        rank_collectives("h", 0, dump(bad))


def test_the_collectives_message_round_trips_through_the_wire():
    records = (rank_collectives("node3", 7, dump(entry(1), entry(2)), where="train.py:88 evaluate"),
               RankCollectives("node3", 6, problem="no answer within 5 s"))
    for dump_id in (4, STOP_STACKS):
        for file in ("/logs/xrun-collectives-x.json", None):
            msg = collectives_message(CollectivesReport(dump_id, records, file))
            assert msg["type"] == Kind.COLLECTIVES.value
            assert read_collectives(decode_body(encode(msg)[4:])) == CollectivesReport(dump_id, records, file)


def test_a_node_cuts_its_records_to_the_bounds_the_head_checks():
    many_groups = [entry(1, pg=(str(g), f"group{g}"), created=T0 + g) for g in range(MAX_GROUPS + 5)]
    wide = entry(2, tensors=MAX_TENSORS + 50, size=3)
    record = rank_collectives("h", 0, dump(*many_groups, wide), where="x" * 5000)
    assert len(record.groups) == MAX_GROUPS and record.group("1") is None  # the oldest groups left out
    assert len(record.group("0").recent[-1].in_sizes) == MAX_TENSORS  # type: ignore[union-attr]
    msg = collectives_message(CollectivesReport(1, (record,)))
    assert read_collectives(msg).ranks == (record,)


def good() -> dict:
    return collectives_message(CollectivesReport(3, (rank_collectives("h", 0, dump(entry(1))),)))


def spoil(path: tuple, value) -> dict:
    msg = json.loads(json.dumps(good()))
    target = msg
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return msg


@pytest.mark.parametrize(("path", "value"), [
    (("id",), True),
    (("id",), "3"),
    (("file",), None),
    (("file",), "x" * 5000),
    (("ranks",), [{}] * 2000),
    (("ranks", 0, "host"), "a\nb"),
    (("ranks", 0, "rank"), -1),
    (("ranks", 0, "where"), "w" * 600),
    (("ranks", 0, "groups"), [{"name": "0"}]),
    (("ranks", 0, "groups", 0, "recent"), [{}] * (RECENT + 1)),
    (("ranks", 0, "groups", 0, "recent", 0, "seq"), 1.5),
    (("ranks", 0, "groups", 0, "recent", 0, "in_sizes"), [[1] * 100]),
    (("ranks", 0, "groups", 0, "recent", 0, "op"), "o" * 300),
    (("ranks", 0, "groups", 0, "recent", 0, "created_ns"), -5),
])
def test_a_malformed_or_oversized_collectives_message_is_refused(path, value):
    read_collectives(good())  # the unspoiled one is fine
    with pytest.raises(ValueError):
        read_collectives(spoil(path, value))


def test_the_entry_times_message_round_trips_and_is_checked():
    times = [entry(s, created=T0 + s * 7_000_123) for s in range(1, 300)]
    sample = EntrySampler(16).sample(5, dump(*times))
    [group] = sample.groups
    # the first sample: 299 in the buffer, 16 at most -> every 32nd
    assert group.name == "0" and list(group.seqs) == list(range(32, 300, 32))
    assert all(t == T0 + s * 7_000_123 for s, t in zip(group.seqs, group.created_ns))  # microsecond steps
    [back] = read_entry_times(decode_body(encode(entry_times_message([sample]))[4:]))
    assert back.rank == 5 and back.groups[0].seqs == group.seqs
    assert all(0 <= t - b < 1000 for t, b in zip(group.created_ns, back.groups[0].created_ns))  # microseconds
    bad = json.loads(json.dumps(entry_times_message([sample])))
    bad["ranks"][0]["groups"][0]["t_us"].append(1)
    with pytest.raises(ValueError, match="differ in length"):
        read_entry_times(bad)
    for spoilt in (list(range(1000)), [1, True], [1, -2], [1, 2.0], "12"):
        bad["ranks"][0]["groups"][0]["seq"] = spoilt
        with pytest.raises(ValueError):
            read_entry_times(bad)


def test_a_sampler_reports_each_collective_once_on_the_grid_of_its_pace():
    sampler = EntrySampler(4)
    assert sampler.pick(0, "0", range(0, 1000)) == [0, 256, 512, 768]  # the buffer: 1,000 -> every 256th
    assert sampler.pick(0, "0", range(200, 1200)) == [1024, 1088, 1152]  # 200 since: every 64th
    assert sampler.pick(0, "0", range(200, 1200)) == []  # nothing new
    assert sampler.pick(0, "0", range(1230, 1250)) == [1232, 1240, 1248]  # 20 since: every 8th
    assert sampler.pick(0, "0", range(1900, 2900)) == [2048, 2304, 2560, 2816]  # faster than the buffer: what it holds
    assert sampler.pick(1, "0", range(0, 10)) == [0, 4, 8]  # another rank, its own
    assert sampler.pick(0, "0", range(0, 6)) == [0, 2, 4]  # numbered from 0 again: restarted, all of it new
    assert sampler.pick(0, "1", []) == []


@given(st.integers(1, 200), st.lists(st.integers(0, 2_000), min_size=2, max_size=6), st.sampled_from([4, 8, 16]))
def test_ranks_asked_at_their_own_times_report_every_grid_multiple_once(pace, starts, per_sample):
    """Nodes whose ranks enter ``pace`` collectives a sample period, each asked at its own moments (``starts``:
    the newest number at each one's first sample; the buffer: the last 1,000): after their first samples, every
    multiple of the pace's stride is reported by every node, once."""
    stride = grid_stride(pace, per_sample)
    first, last = max(starts) + 1, min(starts) + 6 * pace  # what every node sampled after its first sample
    common = {s for s in range(first, last + 1) if s % stride == 0}
    for start in starts:
        sampler, picked = EntrySampler(per_sample), []
        for top in range(start, start + 7 * pace, pace):
            new = sampler.pick(0, "0", range(max(0, top - 999), top + 1))
            assert len(new) <= per_sample and new == sorted(new) and not set(new) & set(picked)
            picked += new
        assert common <= set(picked)


def test_a_big_job_picks_fewer_collectives_a_sample():
    assert picked_per_sample(2) == picked_per_sample(2048) == 16
    assert picked_per_sample(4096) == 8
    assert picked_per_sample(8000) == picked_per_sample(100_000) == 6


def test_where_is_none_without_the_scripts_thread():
    assert where_from_traceback("Current thread 0x1 (most recent call first):\n  <no Python frame>\n") is None


DIED_IN_ALL_REDUCE = """Current thread 0x0 (most recent call first):
  File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/job/train.py", line 16 in <module>
"""


def retired_up_to(*seqs: int) -> dict:
    """What gloo leaves at a rank's exit: every entry retired, and counted completed, the failed one too."""
    found = dump(*(entry(s) for s in seqs))
    found["pg_status"]["0"]["last_completed_collective"] = str(max(seqs))
    return found


def test_a_rank_that_died_in_a_collective_left_it_failed_not_completed():
    """gloo retires a collective that timed out as one that completed (issue 37 §2): the exit traceback says
    which the rank died in, and its record shows it unfinished, its group's counter below it."""
    left = retired_up_to(19, 20, 21)
    record = rank_collectives("n0", 1, with_failure(left, DIED_IN_ALL_REDUCE))
    [group] = record.groups
    assert [(c.seq, c.state, c.finished) for c in group.recent] == [(19, "scheduled", True), (20, "scheduled", True),
                                                                     (21, "failed", False)]
    assert group.last_completed == 20 and group.last_enqueued == 21
    assert left["entries"][-1]["retired"] is True  # torch's own dump is left as it was


@pytest.mark.parametrize("traceback", [None, TRACEBACK.replace("torch/distributed/distributed_c10d.py", "x.py"),
                                       'Current thread 0x0 (most recent call first):\n  File "/job/train.py", '
                                       "line 9 in step\n"])
def test_a_rank_that_ended_any_other_way_left_its_collectives_as_torch_says(traceback):
    left = retired_up_to(20, 21)
    assert with_failure(left, traceback) is left


def test_what_a_rank_left_at_exit_is_read_and_anything_else_refused():
    body = json.dumps({"traceback": DIED_IN_ALL_REDUCE, "flight_recorder": retired_up_to(3)}).encode()
    found, traceback = parse_left_records(body)
    assert found["entries"][0]["collective_seq_id"] == 3 and traceback == DIED_IN_ALL_REDUCE
    assert parse_left_records(json.dumps({"traceback": None, "flight_recorder": {}}).encode()) == ({}, None)
    for bad in (b"{", b"[]", b'{"flight_recorder": []}', b'{"flight_recorder": {"entries": 3}}'):
        with pytest.raises(ValueError):
            parse_left_records(bad)
