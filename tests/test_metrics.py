"""Live metrics (issue 40 §3, xrun.runner.job.metrics): the exposition of a synthetic record parsed back with
prometheus_client's own parser, the flags' one-line errors, and a real head with real agents scraped over HTTP
while its job runs (a real Prometheus scrapes a cluster job: tests/cluster/test_restarts.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from xrun.common.telemetry.usage import RankUsage
from xrun.errors import UsageError
from xrun.runner.job.config import JobConfig
from xrun.runner.job.machine import Job
from xrun.runner.job.metrics.exporter import JobPage, MetricsServer, WideFamilies
from xrun.runner.job.metrics.tally import RecordTally
from xrun.runner.job.record.head import JobRecord
from xrun.runner.metrics_options import MetricsOptions
from xrun.runner.plan import JobRequest, make_plan


def samples(text):
    """{(sample name, frozenset of labels): value} of an exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class Scores:
    """The straggler scores as the collector reads them (xrun.common.result.stragglers.StragglerScores)."""

    def __init__(self, late, named=(), scored=40):
        self.late, self.collectives_scored, self._named = late, scored, named

    def late_now(self):
        return dict(self.late)

    def named(self):
        return {rank: ("b", self.late[rank]) for rank in self._named}


def synthetic(scores):
    """A head's record of a 2-node, 4-rank job that restarted once (rank 3 failed) and runs its second attempt; no
    log directory: the record keeps only its folds."""
    plan = make_plan(JobRequest(script="train.py", run_id="run-1"), {"a": (0, 1), "b": (0, 1)}, "ssh")
    job = Job(JobConfig.from_plan(plan, join_timeout=30.0), now=100.0)
    tally = RecordTally([len(node.ranks) for node in plan.nodes])
    record = JobRecord(plan, job, log_dir=None, now=100.0, folds=(tally,))
    assert record.file is None and record.due() is None
    t = 100.0
    for line in [("node_joined", {"node": 0}), ("node_joined", {"node": 1}), ("attempt_started", {"attempt": 0}),
                 ("node_started", {"attempt": 0, "node": 0}), ("node_started", {"attempt": 0, "node": 1}),
                 ("rank_exited", {"attempt": 0, "rank": 3, "code": 5, "stopped": False}),
                 ("failure", {"attempt": 0, "rank": 3, "exit_code": 5}),
                 ("stop_requested", {"attempt": 0, "by": "failure"}),
                 ("attempt_ended", {"attempt": 0, "rank": 3, "exit_code": 5, "ending": "restart"}),
                 ("node_lost", {"attempt": 1, "node": 1}), ("spare_swapped", {"attempt": 1, "node": 1}),
                 ("attempt_started", {"attempt": 1}), ("node_started", {"attempt": 1, "node": 0}),
                 ("rank_exited", {"attempt": 0, "rank": 2, "code": None, "stopped": True}),  # late: the attempt before's
                 ("rank_exited", {"attempt": 1, "rank": 0, "code": 0, "stopped": False})]:
        t += 1.0
        record.write(t, line[0], **line[1])
    record.used([RankUsage(0, 150, 2048), RankUsage(3, 20, 1024)], t)
    return JobPage(plan, job, record, tally, lambda: scores, clock=lambda: t + 1.0).render().decode()


def test_the_exposition_of_a_synthetic_record():
    got = samples(synthetic(Scores({2: 250.0}, named=(2,))))
    one = lambda name, **labels: got[(name, frozenset(labels.items()))]  # noqa: E731
    assert one("xrun_job_info", run_id="run-1", version=__import__("xrun").__version__) == 1
    assert [s for s in ("starting", "running", "stopping", "restarting", "ended")
            if one("xrun_job_state", xrun_job_state=s)] == ["running"]
    assert one("xrun_job_attempt") == 1
    assert {c: one("xrun_job_restarts_total", cause=c) for c in ("rank", "hang", "node")} == \
        {"rank": 1, "hang": 0, "node": 0}
    assert (one("xrun_nodes_joined_total"), one("xrun_nodes_lost_total"), one("xrun_spares_swapped_total")) == (2, 1, 1)
    # attempt 1: node 0's two ranks started, rank 0 succeeded; node 1 not started; attempt 0's late exit not counted
    assert {s: one("xrun_ranks", state=s) for s in ("waiting", "running", "succeeded", "failed", "stopped")} == \
        {"waiting": 2, "running": 1, "succeeded": 1, "failed": 0, "stopped": 0}
    assert one("xrun_nodes", state="waiting") == 2  # the machine's own (this record fed it nothing)
    assert one("xrun_node_info", node="1", host="b") == 1
    # every rank's lateness, 0 for those on time; the straggler's above the others'
    assert [one("xrun_rank_lateness_seconds", rank=str(r), node=str(r // 2)) for r in range(4)] == [0, 0, 0.25, 0]
    assert one("xrun_stragglers") == 1
    assert one("xrun_rank_cpu_cores", rank="0", node="0") == 1.5
    assert one("xrun_rank_resident_memory_bytes", rank="3", node="1") == 2 * 1024 ** 2 // 2
    assert not any(name == "xrun_rank_cpu_cores" and dict(labels)["rank"] in ("1", "2") for name, labels in got)
    phases = {p: one("xrun_goodput_seconds", phase=p) for p in ("startup", "training", "hang", "restarts", "teardown")}
    # the record's goodput up to the scrape (t 16): started at t 3, the first exit at t 6, the next attempt at t 12,
    # its first rank's exit at t 14 (docs/events.md's rule)
    assert phases == {"startup": 3.0, "training": 3.0 + 2.0, "hang": 0.0, "restarts": 6.0 + 2.0, "teardown": 0.0}
    assert one("xrun_goodput_ratio") == round(5 / 16, 4)


def test_the_series_are_bounded_per_rank_by_rank_and_node_labels_only():
    text = synthetic(Scores({}, scored=0))
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert set(s.labels) <= {"rank", "node", "state", "phase", "cause", "host", "run_id", "version",
                                     "xrun_job_state"}
            if "rank" in s.labels:
                assert set(s.labels) == {"rank", "node"}
    # no collective scored yet: no lateness series (0 would claim every rank was measured on time)
    assert "xrun_rank_lateness_seconds{" not in text


def test_the_wide_families_are_what_prometheus_client_writes_for_the_same_samples():
    """WideFamilies writes its 25,000 lines at 1,000 nodes x 8 ranks by hand (its module says why): what
    ``generate_latest`` makes of the same families, odd values and an odd host included, as prometheus_client's own
    parser reads both."""
    plan = make_plan(JobRequest(script="t.py"), {"a": (0, 1, 2), "b": (0, 1, 2)}, "ssh")
    job = Job(JobConfig.from_plan(plan, join_timeout=30.0), now=0.0)
    job.nodes[1].host = 'a "b"\\c\nd'  # as a spare's might read once seated (the line is written anew)
    record = JobRecord(plan, job, log_dir=None, now=0.0)
    readings = [RankUsage(0, 0, 0), RankUsage(1, 1, 1), RankUsage(4, 12345, 1 << 40), RankUsage(5, 3, 7)]
    record.used(readings, 1.0)
    late = {1: 0.1, 2: 1234.5678, 5: 1e9}
    wide = WideFamilies(plan, job, record, lambda: Scores(late))
    wide.render(2.0)
    job.nodes[0].host = "spare1"
    mine = wide.render(2.0)

    class Same:
        def collect(self):
            info = GaugeMetricFamily("xrun_node_info", WideFamilies.HEAD["xrun_node_info"], labels=["node", "host"])
            for node in job.nodes:
                info.add_metric([str(node.rank), node.host], 1)
            yield info
            for name, values in (("xrun_rank_lateness_seconds", {r: late.get(r, 0.0) / 1e3 for r in range(6)}),
                                 ("xrun_rank_cpu_cores", {u.rank: u.cpu_pct / 100 for u in readings}),
                                 ("xrun_rank_resident_memory_bytes", {u.rank: u.rss_kib * 1024 for u in readings})):
                family = GaugeMetricFamily(name, WideFamilies.HEAD[name], labels=["rank", "node"])
                for rank, value in values.items():
                    family.add_metric([str(rank), str(rank // 3)], value)
                yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Same())
    theirs = generate_latest(registry).decode()  # labels sorted, Go's float spelling: the same figures
    parsed = lambda text: [(f.name, f.documentation, f.type, [(s.name, s.labels, s.value) for s in f.samples])  # noqa: E731
                           for f in text_string_to_metric_families(text)]
    assert parsed(mine.decode()) == parsed(theirs) and len(parsed(theirs)) == 4
    assert 'xrun_node_info{node="0",host="spare1"} 1.0' in mine.decode()
    assert mine.count(b"\n") == theirs.count("\n") and not mine.startswith(b"\n") and mine.endswith(b"\n")


# -- the flags -------------------------------------------------------------------------------------------------


def xrun(*args, cwd):
    return subprocess.run([sys.executable, "-m", "xrun", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.mark.parametrize("args, words", [
    (["--metrics_port", "70000"], "--metrics_port: 70000 is not a TCP port to listen on (1..65535)"),
    (["--metrics_port", "0"], "--metrics_port: 0 is not a TCP port to listen on (1..65535)"),
    (["--metrics_port", "x"], "--metrics_port"),
    (["--metrics_addr", "127.0.0.1"], "--metrics_addr: only applies with --metrics_port"),
    (["--metrics_port", "9100", "--metrics_addr", "a b"], "--metrics_addr"),
])
def test_a_bad_flag_is_one_line_and_exit_2(tmp_path, args, words):
    (tmp_path / "t.py").write_text("")
    result = xrun(*args, "t.py", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and words in result.stderr, result.stderr


def test_a_port_in_use_is_the_flags_error_before_anything_starts(tmp_path):
    (tmp_path / "t.py").write_text("")
    (tmp_path / "hosts").write_text("localhost slots=1\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = xrun("-H", "hosts", "--launcher", "ssh", "--log_dir", "logs", "--metrics_port", str(port), "t.py",
                      cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"xrun: --metrics_port: cannot listen on 127.0.0.1:{port}: "
                                          "Address already in use"]
    assert not (tmp_path / "logs").exists()  # refused before the record opened its file


def test_an_address_not_of_this_machine_names_the_address_flag():
    with pytest.raises(UsageError, match="^--metrics_addr: cannot listen on 192.0.2.1:"):
        MetricsServer(make_plan(JobRequest(script="t.py"), {"a": (0,)}, "ssh"), MetricsOptions(9, "192.0.2.1"))


# -- a real head, scraped while its job runs --------------------------------------------------------------------

JOB = """
import os, sys, time
n = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if n == 0 and os.environ["RANK"] == "1":
    sys.exit(3)
deadline = time.monotonic() + 30
while n == 1 and not os.path.exists("go") and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        return samples(answer.read().decode())


def test_a_local_job_is_scraped_over_http_during_its_run(tmp_path, monkeypatch):
    """``xrun`` with no hostfile: the one-node job's head serves the metrics, and leaves its record and page."""
    monkeypatch.setenv("XRUN_SAMPLE_EVERY_S", "0.2")  # the agents' CPU and RSS readings come in quickly
    (tmp_path / "job.py").write_text(JOB)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "xrun", "--nproc_per_node", "2", "--max_restarts", "2",
                             "--metrics_port", str(port), "--log_dir", "logs", "job.py"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, got = time.monotonic() + 30, {}
    try:
        while time.monotonic() < deadline:
            try:
                got = scrape(port)
            except OSError:  # not listening yet
                got = {}
            running = got.get(("xrun_ranks", frozenset({("state", "running")})))
            if running == 2 and any(name == "xrun_rank_resident_memory_bytes" for name, _ in got):
                break
            time.sleep(0.1)
    finally:
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (tmp_path / "logs" / "events.jsonl").is_file() and (tmp_path / "logs" / "report.html").is_file(), err
    assert got[("xrun_job_restarts_total", frozenset({("cause", "rank")}))] == 1
    assert got[("xrun_job_attempt", frozenset())] == 1
    assert got[("xrun_job_state", frozenset({("xrun_job_state", "running")}))] == 1
    assert got[("xrun_nodes", frozenset({("state", "running")}))] == 1
    rss = {dict(labels)["rank"]: value for (name, labels), value in got.items()
           if name == "xrun_rank_resident_memory_bytes"}
    assert rss and all(value > 1 << 20 for value in rss.values()), rss
    assert got[("xrun_goodput_seconds", frozenset({("phase", "training")}))] > 0
    with pytest.raises(OSError):  # the job is over: so is its endpoint
        time.sleep(1.0)
        scrape(port)
