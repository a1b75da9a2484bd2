"""The head's figures in Prometheus's text format, served over HTTP by ``prometheus_client`` (docs/metrics.md has
every metric, its type and labels).

``JobCollector`` reads the head's state when Prometheus scrapes, and only then: the job's machine (its nodes),
the record's folds (the goodput, ``tally.RecordTally``), its latest CPU and RSS readings and the straggler scores.
Nothing is computed between scrapes. The series are bounded: a handful per job, one per node (``xrun_node_info``)
and three per rank (labels ``rank`` and ``node``, the node rank: a spare that takes a node's place keeps its
series).

The HTTP server runs on threads of its own (``prometheus_client``'s), so a scrape reads what the control
server's loop writes on another thread: each read copies a container in one step, and a read that still meets
one changing under it is taken again (``_settled``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Callable, TypeVar

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.registry import Collector

from xrun import __version__
from xrun.common.result.stragglers import StragglerScores
from xrun.runner.job.machine import Job
from xrun.runner.job.metrics.tally import CAUSES, STATES, RecordTally
from xrun.runner.job.nodes import NodeState
from xrun.runner.job.record.goodput import PHASES
from xrun.runner.job.record.head import JobRecord
from xrun.runner.metrics_options import MetricsOptions, listen_error
from xrun.runner.plan import Plan

T = TypeVar("T")
_TRIES = 5  # reads of a container the loop changes meanwhile (one retry is nearly always enough)


def _settled(read: Callable[[], T]) -> T:
    """``read()``, taken again when the loop thread changed a container while it ran (``RuntimeError``: a dict,
    set or deque mutated during iteration)."""
    for _ in range(_TRIES - 1):
        try:
            return read()
        except RuntimeError:
            continue
    return read()


class JobCollector(Collector):  # type: ignore[misc,unused-ignore]  # Any where prometheus_client is not installed
    """The job's metrics, read from the head's state at each scrape. ``stragglers``: the control server's current
    scores (a restart begins new ones)."""

    def __init__(self, plan: Plan, job: Job, record: JobRecord, tally: RecordTally,
                 stragglers: Callable[[], StragglerScores], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.plan, self.job, self.record, self.tally = plan, job, record, tally
        self.stragglers = stragglers
        self.clock = clock
        self.node_of = [""] * plan.world_size  # rank -> its node rank's label
        for node in plan.nodes:
            for rank in node.ranks:
                self.node_of[rank.rank] = str(node.node_rank)

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        yield from self._job()
        yield from self._nodes()
        yield from self._ranks(now)
        yield from self._goodput(now)

    def _job(self) -> Iterator[Metric]:
        tally = self.tally
        info = GaugeMetricFamily("xrun_job_info", "The job: its run id and xrun's version (always 1)",
                                 labels=["run_id", "version"])
        info.add_metric([self.plan.request.run_id, __version__], 1)
        yield info
        yield StateSetMetricFamily("xrun_job_state", "The job's state (1: the state it is in)",
                                   value={state: state == tally.state for state in STATES})
        yield GaugeMetricFamily("xrun_job_attempt", "The attempt running or last run (0: the first; "
                                "TORCHELASTIC_RESTART_COUNT)", value=tally.attempt)
        restarts = CounterMetricFamily("xrun_job_restarts", "Whole-job restarts (--max_restarts), by the failure "
                                       "that caused each: rank, hang or node", labels=["cause"])
        counts = dict(tally.restarts)
        for cause in CAUSES:
            restarts.add_metric([cause], counts[cause])
        yield restarts

    def _nodes(self) -> Iterator[Metric]:
        counted = dict(self.tally.counted)
        yield CounterMetricFamily("xrun_nodes_joined", "Node agents admitted (a node that rejoins counts again)",
                                  value=counted["node_joined"])
        yield CounterMetricFamily("xrun_nodes_lost", "Node agents lost (connection dropped, silent past the "
                                  "keepalive)", value=counted["node_lost"])
        yield CounterMetricFamily("xrun_spares_swapped", "Hot spares (--spares) seated in a lost or failed node's "
                                  "place", value=counted["spare_swapped"])
        states = dict(self.job.nodes.tally.states)
        by_state = GaugeMetricFamily("xrun_nodes", "The job's nodes by state", labels=["state"])
        for state in NodeState:
            by_state.add_metric([state.value], states[state])
        yield by_state
        info = GaugeMetricFamily("xrun_node_info", "Each node rank's host now (always 1)", labels=["node", "host"])
        for node in list(self.job.nodes):
            info.add_metric([str(node.rank), node.host], 1)
        yield info

    def _ranks(self, now: float) -> Iterator[Metric]:
        by_state = GaugeMetricFamily("xrun_ranks", "This attempt's ranks by state (waiting: not started yet)",
                                     labels=["state"])
        for state, count in self.tally.ranks().items():
            by_state.add_metric([state], count)
        yield by_state
        scores = self.stragglers()
        late, scored = _settled(scores.late_now), scores.collectives_scored
        lateness = GaugeMetricFamily(
            "xrun_rank_lateness_seconds", "Each rank's median lateness in the collectives of its last 16 scored "
            "where it was late, after the others' median (0: on time lately; every rank from the first scored "
            "collective)", labels=["rank", "node"])
        named = GaugeMetricFamily("xrun_stragglers", "Ranks named stragglers now", value=len(scores.named()))
        if scored:
            node_of = self.node_of
            for rank, node in enumerate(node_of):
                lateness.add_metric([str(rank), node], late.get(rank, 0.0) / 1e3)
        yield lateness
        yield named
        usage = _settled(lambda: self.record.usage_now(now))
        cpu = GaugeMetricFamily("xrun_rank_cpu_cores", "Each rank's CPU over its node's last reading period, in "
                                "cores (1.5: one and a half cores busy)", labels=["rank", "node"])
        rss = GaugeMetricFamily("xrun_rank_resident_memory_bytes", "Each rank's resident memory at its node's last "
                                "reading", labels=["rank", "node"])
        for rank, reading in sorted(usage.items()):
            labels = [str(rank), self.node_of[rank] if rank < len(self.node_of) else ""]
            cpu.add_metric(labels, reading.cpu_pct / 100)
            rss.add_metric(labels, reading.rss_kib * 1024)
        yield cpu
        yield rss

    def _goodput(self, now: float) -> Iterator[Metric]:
        goodput = _settled(lambda: self.record.goodput.to_json(round(now - self.record.t0, 3)))
        seconds = GaugeMetricFamily("xrun_goodput_seconds", "The job's wall time so far by phase (docs/events.md, "
                                    "goodput)", labels=["phase"])
        for phase in PHASES:
            seconds.add_metric([phase], goodput["training_s"] if phase == "training" else goodput["lost_s"][phase])
        yield seconds
        yield GaugeMetricFamily("xrun_goodput_ratio", "Training time over wall time so far", value=goodput["share"])


class MetricsServer:
    """The HTTP server on ``options``' address and port, bound at once (a port that cannot be had is the flag's
    one-line error, before the job opens anything else) and serving nothing until ``serve`` hands it the job; the
    tally it reads is ``tally``, for the record to feed from its first line."""

    def __init__(self, plan: Plan, options: MetricsOptions) -> None:
        self.plan = plan
        self.tally = RecordTally([len(node.ranks) for node in plan.nodes])
        self.registry = CollectorRegistry(auto_describe=False)  # only the job's: no process or platform collectors
        try:
            self.httpd, _ = start_http_server(options.port, options.addr, self.registry)
        except OSError as err:
            raise listen_error(options, err) from None
        self.port = self.httpd.server_port
        self._closed = False

    def serve(self, job: Job, record: JobRecord, stragglers: Callable[[], StragglerScores]) -> None:
        self.registry.register(JobCollector(self.plan, job, record, self.tally, stragglers))

    def close(self) -> None:
        """Stop serving without waiting: the server's loop notices within its poll interval (0.5 s), and the job's
        end need not wait for that."""
        if self._closed:
            return
        self._closed = True
        httpd = self.httpd

        def stop() -> None:
            httpd.shutdown()
            httpd.server_close()

        threading.Thread(target=stop, name="xrun-metrics-stop", daemon=True).start()
