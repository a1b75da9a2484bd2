"""Each rank's CPU and RSS while it runs (issue 40 §1): the ``usage`` message's checks against hostile input, the
node's one read per rank of ``/proc``, and the head's record's samples of the readings (xrun.common.telemetry.usage,
xrun.launch.telemetry.usage, xrun.runner.job.record.head).

The record of a real head with real agents, whose busy rank and allocating rank show in its samples, is in
tests/test_events_record.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.channel import Kind, decode_body, encode
from xrun.channel.fields import MAX_RANK
from xrun.channel.framing import HEADER
from xrun.common.rankplan import LaunchOptions
from xrun.common.result.stragglers import StragglerScores
from xrun.common.telemetry.usage import (
    MAX_CPU_PCT,
    MAX_RSS_KIB,
    SAMPLE_EVERY,
    RankUsage,
    read_usage,
    sample_every,
    usage_message,
)
from xrun.launch.telemetry.usage import UsageReader, cpu_pct, read_stat
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import RankExited
from xrun.runner.job.machine import Job
from xrun.runner.job.record.head import JobRecord
from xrun.runner.plan import JobRequest, make_plan


def wire(msg):
    """What the head reads of a message an agent sent: the channel's own frame and decoding."""
    return decode_body(encode(msg)[HEADER.size:])


def test_a_usage_message_round_trips_through_the_channel():
    readings = [RankUsage(0, 97, 1_200_000), RankUsage(MAX_RANK, MAX_CPU_PCT, MAX_RSS_KIB), RankUsage(5, 0, 0)]
    msg = usage_message(readings)
    assert msg == {"type": Kind.USAGE.value, "ranks": [[0, 97, 1_200_000], [MAX_RANK, MAX_CPU_PCT, MAX_RSS_KIB],
                                                       [5, 0, 0]]}
    assert read_usage(wire(msg)) == tuple(readings)


@pytest.mark.parametrize("ranks", [
    None, {}, "0,1,2", [[0, 1]], [[0, 1, 2, 3]], [[True, 1, 2]], [[0, 1.5, 2]], [[0, 1, "2"]], [[-1, 1, 2]],
    [[MAX_RANK + 1, 1, 2]], [[0, MAX_CPU_PCT + 1, 2]], [[0, 1, MAX_RSS_KIB + 1]], [(0, 1, 2)], [{"rank": 0}],
    [[0, 1, 2]] * 1025,
])
def test_a_malformed_or_oversized_usage_is_refused(ranks):
    with pytest.raises(ValueError):
        read_usage({"type": "usage", "ranks": ranks})


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=20)


@settings(max_examples=60, deadline=None)
@given(st.one_of(JSON, st.lists(st.lists(st.integers(-2, 1 << 45) | JSON, max_size=4), max_size=6)))
def test_hostile_usage_is_either_read_within_bounds_or_a_value_error(ranks):
    """Whatever a peer sends: ValueError (the control server's protocol error), or readings within the bounds."""
    try:
        readings = read_usage({"type": "usage", "ranks": ranks})
    except ValueError:
        return
    assert all(type(v) is int for r in readings for v in r)
    assert all(0 <= r.rank <= MAX_RANK and 0 <= r.cpu_pct <= MAX_CPU_PCT and 0 <= r.rss_kib <= MAX_RSS_KIB
               for r in readings)


def test_the_sample_period_is_a_minute_unless_a_test_sets_it():
    assert sample_every({}) == SAMPLE_EVERY == 60.0
    assert sample_every({"XRUN_SAMPLE_EVERY_S": "0.5"}) == 0.5
    for odd in ("", "x", "0", "-1", "nan", "inf", "1e9"):
        assert sample_every({"XRUN_SAMPLE_EVERY_S": odd}) == SAMPLE_EVERY


def test_cpu_pct_is_a_share_of_one_core_within_bounds():
    ticks = os.sysconf("SC_CLK_TCK")
    assert cpu_pct(ticks, 0, 1.0) == 100
    assert cpu_pct(ticks, 0, 4.0) == 25
    assert cpu_pct(10 * ticks, 0, 1.0) == 1000  # a rank with 10 busy threads
    assert cpu_pct(0, 5, 1.0) == 0 and cpu_pct(5, 0, 0.0) == 0
    assert cpu_pct(1 << 60, 0, 1.0) == MAX_CPU_PCT


def test_a_name_with_parentheses_and_spaces_is_read_past(tmp_path):
    """proc(5)'s second field is the command's name in parentheses, which may hold ') (' itself."""
    exe = tmp_path / "a) (b c"
    exe.symlink_to(sys.executable)
    child = subprocess.Popen([str(exe), "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        stat = read_stat(child.pid)
        assert stat is not None
        ticks, start, pages = stat
        assert ticks >= 0 and start > 0 and pages > 0
    finally:
        child.kill()
        child.wait()
    assert read_stat(child.pid) is None  # gone: left out of the sample


def test_a_busy_rank_and_a_big_rank_read_as_such():
    """Checked against psutil's reading of the same processes over the same period (this machine is shared: a
    busy loop may get less than a core)."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"])
    big = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(200 << 20); b[::4096] = b'x' * (50 << 10)"
                                                  "; time.sleep(30)"])
    reader, ranks = UsageReader(), [(0, busy.pid), (1, big.pid)]
    try:
        time.sleep(0.6)
        reader.read(ranks)
        before, t0 = sum(psutil.Process(busy.pid).cpu_times()[:2]), time.monotonic()
        time.sleep(0.6)
        readings = reader.read(ranks)
        spent, seconds = sum(psutil.Process(busy.pid).cpu_times()[:2]) - before, time.monotonic() - t0
        rss = psutil.Process(big.pid).memory_info().rss
    finally:
        for proc in (busy, big):
            proc.kill()
            proc.wait()
    by_rank = {r.rank: r for r in read_usage(wire(usage_message(readings)))}
    assert abs(by_rank[0].cpu_pct - 100 * spent / seconds) <= 10, (by_rank, spent, seconds)
    assert by_rank[0].cpu_pct > by_rank[1].cpu_pct + 10, by_rank
    assert abs(by_rank[1].rss_kib - (rss >> 10)) < 1024 and by_rank[1].rss_kib >= 190 << 10 > by_rank[0].rss_kib, by_rank


def read_lines(record, log_dir):
    assert record.file.close()
    return [json.loads(line) for line in (log_dir / "events.jsonl").read_text().splitlines()]


def record_of(world_size, log_dir):
    """The head's record of a plan with ``world_size`` ranks over 8-rank nodes (bench telemetry_head's way)."""
    world = {f"node{n}": tuple(range(8)) for n in range(world_size // 8)}
    plan = make_plan(JobRequest(script="train.py", launch=LaunchOptions(python=sys.executable)), world, "ssh")
    return JobRecord(plan, Job(JobConfig.from_plan(plan, join_timeout=60.0), now=0.0), log_dir=str(log_dir), now=0.0)


def test_the_samples_carry_the_latest_recent_reading_of_each_live_rank(tmp_path):
    record, scores = record_of(16, tmp_path), StragglerScores(world_size=16)
    assert record.usage_stride == 1
    record.used([RankUsage(3, 99, 3 << 20), RankUsage(0, 5, 1 << 10)], 10.0)
    record.used([RankUsage(3, 250, 5 << 20)], 50.0)  # the latest wins
    record.tick(60.0, scores)
    record.fed(RankExited(0, 3, 3, 0, None, False), (), 70.0)  # rank 3 (node 0) ended: its reading with it
    record.tick(120.0, scores)
    record.used([RankUsage(1, 7, 1 << 20)], 130.0)
    record.tick(180.0, scores)
    record.tick(400.0, scores)  # rank 1's reading is over two periods old: not in this sample
    samples = [line for line in read_lines(record, tmp_path) if line["event"] == "sample"]
    assert [(s["cpu_pct"], s["rss_mib"]) for s in samples] == [
        ([5, None, None, 250], [1, None, None, 5120]), ([5], [1]), ([None, 7], [None, 1024]), ([], [])]


def test_a_big_job_carries_cpu_and_rss_in_every_kth_sample(tmp_path):
    record, scores = record_of(2400, tmp_path), StragglerScores(world_size=2400)
    assert record.usage_stride == 3
    for minute in range(1, 7):
        record.used([RankUsage(rank, 100, 1 << 20) for rank in range(2400)], minute * 60.0 - 1)
        record.tick(minute * 60.0, scores)
    lines = read_lines(record, tmp_path)
    assert lines[0]["usage_every"] == 3
    assert ["cpu_pct" in s for s in lines if s["event"] == "sample"] == [False, False, True, False, False, True]
    full = [s for s in lines if "cpu_pct" in s]
    assert full[0]["cpu_pct"] == [100] * 2400 and full[0]["rss_mib"] == [1024] * 2400
    assert len(json.dumps(full[0], separators=(",", ":"))) < 10 * 2400  # about 10 bytes a rank
