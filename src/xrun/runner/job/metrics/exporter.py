"""The head's figures in Prometheus's text format, served over HTTP (docs/metrics.md has every metric, its type and
labels).

Read when Prometheus scrapes, and only then: the job's machine (its nodes), the record's folds (the goodput,
``tally.RecordTally``), its latest CPU and RSS readings and the straggler scores. Nothing is computed between
scrapes. The series are bounded: a handful per job, one per node (``xrun_node_info``) and three per rank (labels
``rank`` and ``node``, the node rank: a spare that takes a node's place keeps its series).

Two parts, one page: ``JobCollector``, a ``prometheus_client`` collector rendered by ``generate_latest``, has the
job's families; ``WideFamilies`` writes those with a series per node or rank itself, in the same text format
(tests/test_metrics.py holds it to what ``generate_latest`` writes for the same samples). Why: at 1,000 nodes × 8 ranks
``prometheus_client`` spends ~160 ms of CPU to render those 24,000 samples (it validates and escapes every label of
every sample), which at a 15 s scrape would add ~60 % to the head's telemetry CPU (bench ``telemetry_head``,
issue 40's bound: +10 %); their labels are two integers, which need neither, and written directly they take ~13 ms.

The HTTP server runs on threads of its own (``socketserver``'s, one a request), so a scrape reads what the control
server's loop writes on another thread: each read copies a container in one step, and a read that still meets
one changing under it is taken again (``_settled``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any, Callable, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.registry import Collector

from xrun import __version__
from xrun.common.result.stragglers import StragglerScores
from xrun.common.telemetry.usage import RankUsage
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
    """The job's and the nodes' families, read from the head's state at each scrape. ``stragglers``: the control
    server's current scores (a restart begins new ones)."""

    def __init__(self, plan: Plan, job: Job, record: JobRecord, tally: RecordTally,
                 stragglers: Callable[[], StragglerScores], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.plan, self.job, self.record, self.tally = plan, job, record, tally
        self.stragglers = stragglers
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        yield from self._job()
        yield from self._nodes()
        yield from self._ranks()
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

    def _ranks(self) -> Iterator[Metric]:
        by_state = GaugeMetricFamily("xrun_ranks", "This attempt's ranks by state (waiting: not started yet)",
                                     labels=["state"])
        for state, count in self.tally.ranks().items():
            by_state.add_metric([state], count)
        yield by_state
        yield GaugeMetricFamily("xrun_stragglers", "Ranks named stragglers now",
                                value=len(_settled(self.stragglers().named)))

    def _goodput(self, now: float) -> Iterator[Metric]:
        goodput = _settled(lambda: self.record.goodput.to_json(round(now - self.record.t0, 3)))
        seconds = GaugeMetricFamily("xrun_goodput_seconds", "The job's wall time so far by phase (docs/events.md, "
                                    "goodput)", labels=["phase"])
        for phase in PHASES:
            seconds.add_metric([phase], goodput["training_s"] if phase == "training" else goodput["lost_s"][phase])
        yield seconds
        yield GaugeMetricFamily("xrun_goodput_ratio", "Training time over wall time so far", value=goodput["share"])


class WideFamilies:
    """The families with a series per node or per rank, written in Prometheus's text format (the module's docstring
    says why by hand): each node rank's host now; each rank's lateness (every rank, from the attempt's first scored
    collective: before it, none), CPU and resident memory (the ranks with a recent reading)."""

    HEAD = {"xrun_node_info": "Each node rank's host now (always 1)",
            "xrun_rank_lateness_seconds": (
                "Each rank's median lateness in the collectives of its last 16 scored where it was late, after the "
                "others' median (0: on time lately; every rank from the first scored collective)"),
            "xrun_rank_cpu_cores": "Each rank's CPU over its node's last reading period, in cores (1.5: one and a "
                                   "half cores busy)",
            "xrun_rank_resident_memory_bytes": "Each rank's resident memory at its node's last reading"}

    def __init__(self, plan: Plan, job: Job, record: JobRecord, stragglers: Callable[[], StragglerScores]) -> None:
        self.job, self.record, self.stragglers = job, record, stragglers
        self.hosts: dict[int, tuple[str, str]] = {}  # node rank -> the host its line was written for, and the line
        self.labels = [""] * plan.world_size  # rank -> its series' labels, made once
        for node in plan.nodes:
            for rank in node.ranks:
                self.labels[rank.rank] = f'{{rank="{rank.rank}",node="{node.node_rank}"}} '
        self.on_time = [f"xrun_rank_lateness_seconds{label}0.0\n" for label in self.labels]  # most ranks' line
        # rank -> the reading its two lines were written for, and them: a node reads its ranks once a period, so
        # a scrape writes only the readings that came since the one before
        self.written: dict[int, tuple[RankUsage, str, str]] = {}

    def render(self, now: float) -> bytes:
        labels = self.labels
        lines = _head("xrun_node_info")
        for node in list(self.job.nodes):
            host = self.hosts.get(node.rank)
            if host is None or host[0] != node.host:  # a spare took the node's place
                line = f'xrun_node_info{{node="{node.rank}",host="{_escaped(node.host)}"}} 1.0\n'
                host = self.hosts[node.rank] = (node.host, line)
            lines.append(host[1])
        scores = self.stragglers()
        lines += _head("xrun_rank_lateness_seconds")
        if scores.collectives_scored:
            lateness = list(self.on_time)
            for rank, ms in _settled(scores.late_now).items():
                if 0 <= rank < len(lateness):
                    lateness[rank] = f"xrun_rank_lateness_seconds{labels[rank]}{ms / 1e3!r}\n"
            lines += lateness
        cpu, rss = _head("xrun_rank_cpu_cores"), _head("xrun_rank_resident_memory_bytes")
        written = self.written
        for rank, reading in sorted(_settled(lambda: self.record.usage_now(now)).items()):
            if not 0 <= rank < len(labels):
                continue  # not a rank of this job's plan: no series of its own
            known = written.get(rank)
            if known is None or known[0] is not reading:
                label = labels[rank]
                known = written[rank] = (reading, f"xrun_rank_cpu_cores{label}{reading.cpu_pct / 100!r}\n",
                                         f"xrun_rank_resident_memory_bytes{label}{float(reading.rss_kib * 1024)!r}\n")
            cpu.append(known[1])
            rss.append(known[2])
        return "".join(lines + cpu + rss).encode()


class JobPage:
    """The whole exposition of one job, read when ``render`` is called: ``JobCollector``'s families through
    ``prometheus_client``, then ``WideFamilies``'."""

    def __init__(self, plan: Plan, job: Job, record: JobRecord, tally: RecordTally,
                 stragglers: Callable[[], StragglerScores], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry(auto_describe=False)  # only the job's: no process or platform collectors
        self.registry.register(JobCollector(plan, job, record, tally, stragglers, clock=clock))
        self.wide = WideFamilies(plan, job, record, stragglers)
        self.clock = clock

    def render(self) -> bytes:
        families: bytes = generate_latest(self.registry)
        return families + self.wide.render(self.clock())


def _escaped(value: str) -> str:
    """A label value as the text format spells it (a backslash, a double quote and a newline escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _head(name: str) -> list[str]:
    return [f"# HELP {name} {WideFamilies.HEAD[name]}\n# TYPE {name} gauge\n"]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds xrun's exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """No line per request on the job's console."""


class MetricsServer:
    """The HTTP server on ``options``' address and port, bound at once (a port that cannot be had is the flag's
    one-line error, before the job opens anything else) and serving an empty page until ``serve`` hands it the
    job; the tally it reads is ``tally``, for the record to feed from its first line."""

    def __init__(self, plan: Plan, options: MetricsOptions, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.plan, self.clock = plan, clock
        self.tally = RecordTally([len(node.ranks) for node in plan.nodes])
        self.job_page: JobPage | None = None
        try:
            infos = socket.getaddrinfo(options.addr, options.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            server: type[_Server] = type("_Bound", (_Server,), {"address_family": infos[0][0]})  # IPv6 too
            self.httpd: WSGIServer = make_server(str(infos[0][4][0]), options.port, self.app, server,
                                                 handler_class=_Quiet)
        except OSError as err:
            raise listen_error(options, err) from None
        self.port = self.httpd.server_port
        threading.Thread(target=self.httpd.serve_forever, name="xrun-metrics", daemon=True).start()
        self._closed = False

    def serve(self, job: Job, record: JobRecord, stragglers: Callable[[], StragglerScores]) -> None:
        self.job_page = JobPage(self.plan, job, record, self.tally, stragglers, clock=self.clock)

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """Every path and method gets the page (as ``prometheus_client``'s own server does): a scraper's request
        changes nothing."""
        page = self.job_page
        body = b"" if page is None else page.render()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
        return [body]

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
