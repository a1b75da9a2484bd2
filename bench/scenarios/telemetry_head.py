"""Scale scenario ``telemetry_head`` (issue 31): what the head spends on telemetry at 1,000 nodes × 8 ranks, in
CPU-seconds per minute (target ≤ 1).

The traffic is a job's as the nodes send it: every node, every ``SAMPLE_EVERY`` (10) s at the wall clock's
multiples of it (``until_the_next_sample``) by its own clock, up to 200 ms late (its timer, its ranks' dumps; with
``phases=spread``, each at a phase of its own over the whole period instead: the worst case for the samples'
overlap), one ``entry_times`` message with its 8 ranks' samples (the default
group; its ranks enter ``rate`` collectives a second, 20 by default: a DDP step's buckets at a few steps a
second; each rank's sample is what the node side's own ``EntrySampler`` picks from the last ``DEFAULT_ENTRIES``
collectives, the Flight Recorder's buffer), and a pong to every ping (``PING_INTERVAL``) carrying the node's
clock, which is off the head's by up to 50 ms, and every ``usage.SAMPLE_EVERY`` (60) s at a phase of its own a
``usage`` message with its 8 ranks' CPU and RSS (issue 40 §1). One rank (the middle node's fourth) is on time
during the warm-up and enters every collective 50 ms late after it: ``named_after_s`` is how long the head took to
name it.

The messages are encoded with the channel's own ``encode`` before the clock starts; timed is what the head does
with them, as the control server's readers do (``TelemetryHead``): ``decode_body`` (the channel's frame -> message),
``read_entry_times``, the node's clock offset and ``StragglerScores.add``; for a pong ``fields_error`` and
``ClockOffsets.pong``, and ``ClockOffsets.sent`` per ping; for a usage message ``decode_body`` and ``read_usage``
(``usage_s``; with the record, its ``used`` is in ``record_s``). With ``record`` (1, the default: as with ``--log_dir``)
the job's record (issue 40, xrun.runner.job.record) takes each message as the control server hands it over
(``heard``, ``fed`` with the message's ``Heard`` event, ``sampled`` after the scoring) and its timer's ``tick``
after each, writing ``events.jsonl`` to a temporary folder: ``record_s``. The first minute fills the head's state
and is not counted; the next ``minutes`` are, on this thread's CPU clock (``time.thread_time``). Figures per minute:
``cpu_s`` (all of it), ``decode_s`` (the frames' decoding alone: the channel's part), ``scored`` (collectives
scored), ``named`` (1 when the slow rank, and only it, was named a straggler by the end) and ``named_after_s``
(from the warm-up's end, when it became slow, to the line that names it; the issue's bound: 60 s).

With ``metrics=S`` (issue 40 §3, as with ``--metrics_port``), the record also feeds the metrics' tally
(xrun.runner.job.metrics.tally: in ``record_s``) and every S seconds of the job Prometheus scrapes: the page is
read from the head's state and rendered, as the HTTP thread does (``JobPage.render``: ``metrics_s``; the socket's
own work is not counted); ``scrape_s`` is one scrape's CPU (the median), ``scrape_kb`` its size.

Knobs: ``nodes`` (quick 100, full 1000), ``ranks`` (8), ``rate`` (20), ``minutes`` (quick 1, full 2),
``phases`` (``aligned``, ``spread``), ``record`` (1; 0: without the job's record), ``metrics`` (0: no scrapes; else
seconds between them, with the record).
"""

from __future__ import annotations

import heapq
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from bench import harness
from bench.scenarios.base import Context, finish, median, section, target
from xrun.channel import PING_INTERVAL, Kind, Message, message
from xrun.channel.fields import PONG_FIELDS, fields_error
from xrun.channel.framing import HEADER, decode_body, encode
from xrun.common.rankplan import LaunchOptions
from xrun.common.result.stragglers import ClockOffsets, StragglerScores
from xrun.common.telemetry import usage
from xrun.common.telemetry.records import (
    EntrySampler,
    EntryTimes,
    GroupTimes,
    entry_times_message,
    picked_per_sample,
    read_entry_times,
)
from xrun.launch.doctor.node_doctor import SAMPLE_EVERY
from xrun.launch.telemetry.endpoints import DEFAULT_ENTRIES
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import Heard
from xrun.runner.job.machine import Job
from xrun.runner.job.metrics.exporter import JobPage
from xrun.runner.job.metrics.tally import RecordTally
from xrun.runner.job.record.head import JobRecord
from xrun.runner.plan import JobRequest, make_plan

NAME = "telemetry_head"
TITLE = "Scale C. The head's telemetry: entry_times and pongs of N nodes × 8 ranks, CPU per minute"
TABLE = {
    "metrics": [["cpu_s", "head CPU per minute", "s"], ["decode_s", "decoding entry_times frames", "s"],
                ["read_s", "reading the samples", "s"], ["score_s", "scoring", "s"],
                ["clocks_s", "clock offsets (pongs)", "s"], ["usage_s", "decoding and reading usage (CPU, RSS)", "s"],
                ["record_s", "the job's record (events.jsonl)", "s"],
                ["metrics_s", "Prometheus scrapes (metrics=S)", "s"], ["scrape_s", "one scrape", "s"],
                ["scrape_kb", "one scrape's text", "KB"],
                ["scored", "collectives scored per minute", ""], ["named", "slow rank named", ""],
                ["named_after_s", "slow rank named after", "s"]],
    "references": [],
}
T0 = 1_795_860_000_000_000_000
LATE_NS = 50_000_000  # the slow rank's lateness at every collective
WARM_UP_S = 60.0


def run(ctx: Context) -> dict[str, Any]:
    nodes = ctx.option("nodes", 100, 1000)
    ranks = ctx.option("ranks", 8, 8)
    rate = ctx.option("rate", 20.0, 20.0)
    minutes = ctx.option("minutes", 1, 2)
    phases = ctx.option("phases", "aligned", "aligned")
    record = ctx.option("record", 1, 1)
    metrics = ctx.option("metrics", 0, 0)
    if metrics and not record:
        raise ValueError("telemetry_head: metrics=S reads the job's record: keep record=1")
    if phases not in ("aligned", "spread"):
        raise ValueError(f"telemetry_head: phases={phases!r}: use aligned (as the nodes sample) or spread")
    rounds = ctx.rounds(1, 3)
    sec = section(NAME, TITLE, params={"nodes": nodes, "ranks": ranks, "rate": rate, "minutes": minutes,
                                       "phases": phases, "record": record, "metrics": metrics,
                                       "rounds": rounds}, skipped={}, table=TABLE,
                  groups=[], targets=[])
    traffic = Traffic(nodes, ranks, rate, WARM_UP_S + 60.0 * minutes, seed=ctx.rng.randrange(1 << 30),
                      spread=phases == "spread")

    def trial(variant: str) -> harness.Trial:
        return harness.Trial(metrics=head_minute(traffic, minutes, record=bool(record), scrape_every=float(metrics)),
                             exit_code=0)

    results = harness.run_rounds(["xrun"], rounds, trial, rng=ctx.rng, label=NAME)
    group = {"label": f"{nodes} nodes × {ranks} ranks, {rate:g} collectives/s", "params": {"nodes": nodes},
             **harness.summarize_group(results, references=())}
    sec["groups"].append(group)
    sec["targets"].append(target(f"head CPU per minute at {nodes} × {ranks}", median(group, "xrun", "cpu_s"), 1.0,
                                 "s"))
    sec["targets"].append(target("slow rank named after it became slow", median(group, "xrun", "named_after_s"),
                                 60.0, "s"))
    return finish(sec)


class Traffic:
    """A job's telemetry as (time, node, frame) in the order the head gets it; frames already encoded."""

    def __init__(self, nodes: int, ranks: int, rate: float, seconds: float, *, seed: int,
                 spread: bool = False) -> None:
        rng = random.Random(seed)
        used = random.Random(seed + 1)  # the usage messages' own: the other traffic is as it was without them
        self.nodes, self.ranks = nodes, ranks
        self.slow = (nodes // 2) * ranks + 3 if ranks > 3 else None
        offsets = [rng.randrange(-50_000_000, 50_000_000) for _ in range(nodes)]
        events: list[tuple[float, int, str, bytes]] = []
        for node in range(nodes):
            sampler = EntrySampler(picked_per_sample(nodes * ranks))  # each node's agent has its own
            # aligned: the wall clock's multiples by the node's clock (ahead by its offset: there sooner)
            phase = rng.uniform(0.0, SAMPLE_EVERY) if spread else SAMPLE_EVERY - offsets[node] / 1e9
            for k in range(int((seconds - phase) // SAMPLE_EVERY) + 1):
                at = phase + k * SAMPLE_EVERY + (0.0 if spread else rng.uniform(0.0, 0.2))
                events.append((at, node, "entry_times",
                               _frame(entry_times_message(self._sample(sampler, node, at, rate, offsets[node],
                                                                       rng)))))
            phase = used.uniform(0.0, usage.SAMPLE_EVERY)
            for k in range(int((seconds - phase) // usage.SAMPLE_EVERY) + 1):
                readings = [usage.RankUsage(node * ranks + local, used.randrange(80, 120),
                                            used.randrange(1 << 20, 1 << 24)) for local in range(ranks)]
                events.append((phase + k * usage.SAMPLE_EVERY, node, "usage", _frame(usage.usage_message(readings))))
            for k in range(int(seconds // PING_INTERVAL) + 1):
                at = k * PING_INTERVAL + rng.uniform(0.0, 0.05)
                trip_ns = rng.randrange(200_000, 2_000_000)
                clock_ns = T0 + int(at * 1e9) + trip_ns // 2 + offsets[node]
                events.append((at, node, "pong", _frame(message(Kind.PONG, clock_ns=clock_ns))))
        heapq.heapify(events)
        self.events = [heapq.heappop(events) for _ in range(len(events))]

    def _sample(self, sampler: EntrySampler, node: int, at: float, rate: float, offset_ns: int,
                rng: random.Random) -> list[EntryTimes]:
        top = int(at * rate)
        buffer = range(max(0, top - DEFAULT_ENTRIES + 1), top + 1)
        samples = []
        for local in range(self.ranks):
            rank = node * self.ranks + local
            picked = sampler.pick(rank, "0", buffer)
            late = LATE_NS if rank == self.slow else 0
            times = tuple(T0 + int(seq / rate * 1e9) + offset_ns + rng.randrange(0, 3_000_000)
                          + (late if seq / rate >= WARM_UP_S else 0) for seq in picked)
            samples.append(EntryTimes(rank, (GroupTimes("0", tuple(picked), times),)))
        return samples


def _frame(msg: Message) -> bytes:
    return encode(msg)[HEADER.size:]


def head_minute(traffic: Traffic, minutes: int, *, record: bool = True,
                scrape_every: float = 0.0) -> dict[str, float | None]:
    """Feed the head's code all of ``traffic``; the CPU of the minutes after the warm-up, per minute."""
    with tempfile.TemporaryDirectory(prefix="xrun-bench-record-") as log_dir:
        return _head_minute(traffic, minutes, _record(traffic, log_dir, metrics=scrape_every > 0) if record else None,
                            scrape_every=scrape_every)


def _record(traffic: Traffic, log_dir: str, *, metrics: bool = False) -> JobRecord:
    """The job's record of a plan of ``traffic``'s nodes and ranks, as the control server makes it (time 0); with
    ``metrics``, its first fold is the metrics' tally (as ``--metrics_port``'s server hands it over)."""
    world = {f"node{n}": tuple(range(traffic.ranks)) for n in range(traffic.nodes)}
    request = JobRequest(script="train.py", launch=LaunchOptions(python=sys.executable))
    plan = make_plan(request, world, "ssh")
    folds = (RecordTally([len(node.ranks) for node in plan.nodes]),) if metrics else ()
    return JobRecord(plan, Job(JobConfig.from_plan(plan, join_timeout=60.0), now=0.0), log_dir=log_dir, now=0.0,
                     folds=folds)


def _heard(record: JobRecord, node: int, msg: Message, heard: Heard, at: float, scores: StragglerScores) -> None:
    """The control server's hooks for every agent message: the record hears it, is fed its Heard, and ticks."""
    record.heard(node, msg, at)
    record.fed(heard, (), at)
    record.tick(at, scores)


def _head_minute(traffic: Traffic, minutes: int, record: JobRecord | None, *,
                 scrape_every: float = 0.0) -> dict[str, float | None]:
    clocks, scores = ClockOffsets(), StragglerScores(world_size=traffic.nodes * traffic.ranks)
    now = [0.0]  # the job's time, for the collector's clock
    page = None
    if record is not None and scrape_every > 0:
        tally = next(fold for fold in record.folds if isinstance(fold, RecordTally))
        page = JobPage(record.plan, record.job, record, tally, lambda: scores, clock=lambda: now[0])
    next_scrape, scrapes = scrape_every, []
    hosts = [f"node{n}" for n in range(traffic.nodes)]
    spent = {"decode_s": 0.0, "read_s": 0.0, "score_s": 0.0, "clocks_s": 0.0, "usage_s": 0.0, "record_s": 0.0,
             "metrics_s": 0.0}
    size = 0
    scored_before = 0
    counting = False
    named_at = None
    for at, node, kind, frame in traffic.events:
        if not counting and at >= WARM_UP_S:
            counting, scored_before = True, scores.collectives_scored
        heard = Heard(node)  # the machine's event for either message, made with or without the record: not timed
        while page is not None and at >= next_scrape:  # Prometheus scrapes between two messages
            now[0] = next_scrape
            t0 = time.thread_time()
            size = len(page.render())
            took = time.thread_time() - t0
            if counting:
                spent["metrics_s"] += took
                scrapes.append(took)
            next_scrape += scrape_every
        if kind == "pong":
            msg = decode_body(frame)  # the pong is the channel's keepalive: its decoding is not telemetry's
            t0 = time.thread_time()
            if fields_error(msg, PONG_FIELDS) is not None:
                raise AssertionError("a pong the bench made is malformed")
            head_ns = T0 + int(at * 1e9)
            clocks.sent(node, head_ns - 1_000_000)
            clocks.pong(node, head_ns, msg.get("clock_ns"))
            t1 = time.thread_time()
            if record is not None:  # the control server's hooks for a pong
                _heard(record, node, msg, heard, at, scores)
            if counting:
                spent["clocks_s"] += t1 - t0
                spent["record_s"] += time.thread_time() - t1
            continue
        if kind == "usage":
            t0 = time.thread_time()
            msg = decode_body(frame)
            readings = usage.read_usage(msg)
            t1 = time.thread_time()
            if record is not None:  # the control server's hooks for usage: used, then those of every message
                record.used(readings, at)
                _heard(record, node, msg, heard, at, scores)
            if counting:
                spent["usage_s"] += t1 - t0
                spent["record_s"] += time.thread_time() - t1
            continue
        t0 = time.thread_time()
        msg = decode_body(frame)
        t1 = time.thread_time()
        samples = read_entry_times(msg)
        t2 = time.thread_time()
        offset = clocks.of(node)
        lines = scores.add(hosts[node], offset, samples)
        t3 = time.thread_time()
        if record is not None:  # and for entry_times: sampled after the scoring too
            record.sampled(node, offset, samples, scores, changed=bool(lines), now=at)
            _heard(record, node, msg, heard, at, scores)
        if named_at is None and any(f"rank {traffic.slow} " in line and "recovered" not in line for line in lines):
            named_at = at
        if counting:
            spent["decode_s"] += t1 - t0
            spent["read_s"] += t2 - t1
            spent["score_s"] += t3 - t2
            spent["record_s"] += time.thread_time() - t3
    named = [s.rank for s in scores.scores() if s.straggler]
    return {"cpu_s": sum(spent.values()) / minutes, **{k: v / minutes for k, v in spent.items()},
            "scored": (scores.collectives_scored - scored_before) / minutes,
            "named": float(traffic.slow is not None and named == [traffic.slow]),
            "named_after_s": None if named_at is None else named_at - WARM_UP_S,  # None: not named (censored)
            "scrape_s": statistics.median(scrapes) if scrapes else None, "scrape_kb": size / 1e3 if scrapes else None}
