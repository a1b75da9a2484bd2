"""--precheck (issue 24) without a cluster: the decision on literal results, the job state machine holding the
barrier through the check, the channel driver over a fake network (the rounds and verdicts are
``xrun check --network``'s, tested in tests/test_network_check.py), and a node's probes on real loopback sockets.
The namespace-cluster tests are in tests/cluster/test_network.py."""

import socket
import time
from dataclasses import replace

import pytest

from tests.test_job import GONE, HOSTS, OK, SHORT_JOIN, SLOW, STARTED, STATIC, play
from xrun.channel import Kind, message
from xrun.launch.network.precheck_answers import ProbeAnswers
from xrun.runner.job.events import Done, PrecheckDone, RunPrecheck, SendStart, SendStop, ShowLine, Tick
from xrun.runner.network.coordinate import Check, Request, Stepper
from xrun.runner.network.node_results import NodeRow, PrecheckResult
from xrun.runner.network.node_verdicts import LinkVerdict
from xrun.runner.network.precheck_channel import ChannelPrecheck
from xrun.runner.network.precheck_decision import decide, passed_line
from xrun.runner.network.probe_requests import probe_budget

PRECHECK = replace(STATIC, precheck=True)


def result(*verdicts, elapsed=1.5):
    rows = tuple(NodeRow(HOSTS[i], "eth0", f"10.0.0.{i + 1}", v) for i, v in enumerate(verdicts))
    return PrecheckResult(tuple(range(len(verdicts))), rows, elapsed)


# -- the decision ----------------------------------------------------------------------------------------------


def test_a_healthy_result_starts_the_ranks_and_says_so_in_one_line():
    healthy = result(OK, OK, OK, elapsed=2.25)
    assert decide(healthy) is None and healthy.bad == ()
    assert passed_line(healthy) == "precheck passed: 3 node(s) ok in 2.2 s, median 900.0 MB/s"


def test_a_bad_node_ends_the_job_naming_it_and_its_figures():
    bad = decide(result(OK, SLOW, OK))
    assert bad is not None and bad.hosts == ("b",)
    assert bad.reason == ("precheck: 1 of 3 node(s) bad, no rank started: b slow: throughput 0.5 MB/s < 0.5 x "
                              "median 900.0 (best pair 0.060 ms, 0.5 MB/s)")


def test_every_bad_node_is_named_with_its_rank_for_the_spares_to_replace():
    bad = result(OK, SLOW, GONE)
    assert [(node.rank, node.row.host, node.row.result.verdict) for node in bad.bad] == [
        (1, "b", LinkVerdict.SLOW), (2, "c", LinkVerdict.UNREACHABLE)]
    nodes_bad = decide(bad)
    assert nodes_bad is not None and nodes_bad.hosts == ("b", "c")
    assert "c unreachable: refuses connections: connection to 10.0.0.3:4000 refused (no pair with it succeeded)" \
        in nodes_bad.reason
    assert bad.table()[0].split() == ["host", "interface", "address", "latency_ms", "MB/s", "verdict"]
    assert bad.table()[-1].startswith("rule: slow: best throughput < 0.5 x the median")


# -- the job state machine ---------------------------------------------------------------------------------------


def test_the_barrier_holds_the_ranks_through_the_precheck():
    job, actions = play(STARTED, config=replace(SHORT_JOIN, precheck=True))
    assert RunPrecheck((0, 1, 2), "10.0.0.1", ("a", "b", "c")) in actions and not any(isinstance(a, SendStart) for a in actions)
    _, later = play([9.0, Tick()], job=job)  # past --join_timeout: the check bounds its own time, no failure
    assert not any(isinstance(a, SendStop) for a in later) and job.failure is None


def test_a_passed_precheck_starts_every_node_after_its_line():
    job, _ = play(STARTED, config=PRECHECK)
    _, actions = play([2.0, PrecheckDone(result(OK, OK, OK))], job=job)
    lines = [a.text for a in actions if isinstance(a, ShowLine)]
    assert lines == ["precheck passed: 3 node(s) ok in 1.5 s, median 900.0 MB/s"]
    assert [a for a in actions if isinstance(a, SendStart)] == [SendStart((0, 1, 2), "10.0.0.1", 29501)]


def test_a_failed_precheck_stops_every_node_and_the_job_exits_1_naming_it():
    job, _ = play(STARTED, config=PRECHECK)
    _, actions = play([2.0, PrecheckDone(result(OK, SLOW, OK)), Done(0, 143), Done(1, 143), Done(2, 143)], job=job)
    assert not any(isinstance(a, SendStart) for a in actions)
    (stop,) = [a for a in actions if isinstance(a, SendStop)]
    assert stop.nodes == (0, 1, 2) and stop.reason.startswith("precheck: 1 of 3 node(s) bad, no rank started: b slow")
    assert job.verdict().exit_code == 1 and job.verdict().failure.host == "b" and job.verdict().failure.final


def test_a_precheck_that_ends_after_the_job_began_stopping_changes_nothing():
    job, _ = play([*STARTED, 1.0, Done(1, 3)], config=PRECHECK)  # node 1's agent ended: the job stops
    _, actions = play([PrecheckDone(result(OK, OK, OK))], job=job)
    assert not any(isinstance(a, SendStart) for a in actions)


def test_without_the_flag_the_barrier_starts_at_once():
    _, actions = play(STARTED)
    assert not any(isinstance(a, RunPrecheck) for a in actions) and any(isinstance(a, SendStart) for a in actions)


# -- the coordinator's steps -------------------------------------------------------------------------------------


def test_a_stepper_refuses_answers_that_do_not_fit():
    stepper = Stepper(Check(range(2)))
    first = stepper.first()
    assert [(r.src, r.dst) for r in first] == [(0, 1)]
    with pytest.raises(ValueError, match="1 requests were answered with 0 probes"):
        stepper.answer([])


# -- the driver over the channel, against a fake network ---------------------------------------------------------


class FakeServer:
    """What ChannelPrecheck is handed of the control server; a node answers as the network says, or stays mute."""

    def __init__(self, count, *, slow=(), mute_open=(), mute_probe=()):
        self.count, self.stopping = count, False
        self.slow, self.mute_open, self.mute_probe = set(slow), set(mute_open), set(mute_probe)
        self.sent, self.fed, self.timers, self.inbox = [], [], [], []

    def start(self):
        """The check over every node, as the server starts it for a ``RunPrecheck``."""
        return ChannelPrecheck(range(self.count), [f"n{i}" for i in range(self.count)], toward="10.0.0.0", now=0.0,
                               send=self.send, add_timer=self.add_timer, stopping=lambda: self.stopping,
                               done=self.fed.append)

    def add_timer(self, due, fire):
        self.timers.append((due, fire))

    def send(self, node, msg):
        self.sent.append((node, msg))
        if msg["type"] == Kind.PROBE_OPEN.value and node not in self.mute_open:
            self.inbox.append((node, message(Kind.PROBE_READY, address=f"10.0.0.{node}", port=4000 + node,
                                             interface="eth0")))
        elif msg["type"] == Kind.PROBE.value and node not in self.mute_probe:
            dst = int(msg["probe"].rpartition(":")[2]) - 4000
            rate = None if msg["mode"] == "reach" else (0.5 if dst in self.slow else 900.0)
            self.inbox.append((node, message(Kind.PROBED, id=msg["id"], ok=True, latency_ms=0.05,
                                             throughput_mbs=rate, error="")))

    def deliver(self, driver, now=0.0):
        while self.inbox:
            node, msg = self.inbox.pop(0)
            driver.message(node, msg, now)


def drive(server, *, until=200.0):
    driver = server.start()
    now = 0.0
    while not server.fed and now < until:
        server.deliver(driver, now)
        now += 1.0
        driver.tick(now)
    (result,) = server.fed
    return result


def verdicts_of(res):
    return {row.host: row.result.verdict.value for row in res.rows}


@pytest.mark.parametrize("count", [2, 3, 5, 8])
def test_the_driver_runs_the_check_over_the_agents(count):
    res = drive(FakeServer(count))
    assert set(verdicts_of(res).values()) == {"ok"} and res.ranks == tuple(range(count))
    assert all(row.interface == "eth0" for row in res.rows)


def test_the_driver_names_a_slow_node_and_no_other():
    res = drive(FakeServer(5, slow={3}))
    assert verdicts_of(res) == {"n0": "ok", "n1": "ok", "n2": "ok", "n3": "slow", "n4": "ok"}


def test_a_node_that_opens_no_probe_server_is_unreachable_after_the_deadline():
    res = drive(FakeServer(4, mute_open={2}))
    assert verdicts_of(res) == {"n0": "ok", "n1": "ok", "n2": "unreachable", "n3": "ok"}
    assert "did not open a probe server within" in res.rows[2].result.reason


def test_a_probe_never_answered_fails_after_its_budget():
    res = drive(FakeServer(4, mute_probe={1}))
    assert verdicts_of(res)["n1"] == "unreachable", verdicts_of(res)
    assert res.elapsed >= probe_budget(Request(1, 0))


def test_a_late_answer_to_an_earlier_checks_probe_is_not_this_checks():
    """A restart checks again (standing spares included): an answer to the previous check's probe that arrives
    late must not stand for one of the new check's, which it would if both numbered their probes from 0."""
    first = FakeServer(3)
    drive(first)
    old_ids = {msg["id"] for _, msg in first.sent if msg["type"] == Kind.PROBE.value}
    second = FakeServer(3, mute_probe={0, 1, 2})  # the new check's probes go unanswered...
    driver = second.start()
    second.deliver(driver)
    new_ids = {msg["id"] for _, msg in second.sent if msg["type"] == Kind.PROBE.value}
    assert old_ids and new_ids and not old_ids & new_ids
    for node, msg in first.sent:  # ...while the old check's answers arrive now, as good as any
        if msg["type"] == Kind.PROBE.value:
            driver.message(node, message(Kind.PROBED, id=msg["id"], ok=True, latency_ms=0.05, throughput_mbs=900.0,
                                         error=""), 1.0)
    assert driver.answers == {}


def test_the_driver_stops_quietly_when_the_job_stops():
    server = FakeServer(3)
    driver = server.start()
    server.stopping = True
    server.deliver(driver)
    driver.tick(100.0)
    assert server.fed == [] and [msg["type"] for _, msg in server.sent] == [Kind.PROBE_OPEN.value] * 3


# -- a node's side, on real sockets ------------------------------------------------------------------------------


def test_a_node_opens_its_probe_server_and_measures_a_peer_on_loopback():
    replies = []
    probes = ProbeAnswers(replies.append)
    try:
        probes.handle(message(Kind.PROBE_OPEN, toward="127.0.0.1"))
        (ready,) = replies
        assert ready["type"] == Kind.PROBE_READY.value and isinstance(ready["port"], int)
        with socket.create_connection(("127.0.0.1", ready["port"]), timeout=2):
            pass  # it listens
        probes.handle(message(Kind.PROBE, id=7, probe=f"127.0.0.1:{ready['port']}", mode="measure", seconds=0.05,
                              timeout=2.0))
        probes.handle(message(Kind.PROBE, id=8, probe="127.0.0.1:1", mode="reach", seconds=0.0, timeout=2.0))
        deadline = time.monotonic() + 10
        while len(replies) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        probes.close()
    measured, refused = replies[1], replies[2]
    assert measured["type"] == Kind.PROBED.value and measured["id"] == 7 and measured["ok"], measured
    assert measured["throughput_mbs"] > 0 and measured["latency_ms"] > 0
    assert refused["id"] == 8 and not refused["ok"] and "refused" in refused["error"], refused


def test_a_node_answers_the_next_attempts_precheck_after_the_barrier_closed_its_probes():
    """The agent closes its answers when a barrier opens and hands the same object the next attempt's probes: the
    second check gets a fresh server and worker (a closed one never answered: the restart's precheck found every
    node unreachable)."""
    replies = []
    probes = ProbeAnswers(replies.append)
    try:
        for attempt in range(2):
            replies.clear()
            probes.handle(message(Kind.PROBE_OPEN, toward="127.0.0.1"))
            port = replies[0]["port"]
            probes.handle(message(Kind.PROBE, id=attempt, probe=f"127.0.0.1:{port}", mode="reach", seconds=0.0,
                                  timeout=2.0))
            deadline = time.monotonic() + 10
            while len(replies) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(replies) == 2 and replies[1]["id"] == attempt and replies[1]["ok"], (attempt, replies)
            probes.close()
    finally:
        probes.close()


# -- the flag: bad input and the dry run -------------------------------------------------------------------------


@pytest.fixture
def two_hosts(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "hosts").write_text("w0 slots=1\nw1 slots=1\n")
    return tmp_path


def xrun(capsys, *argv):
    from xrun.joined.entry import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_dry_run_says_the_precheck_will_run(two_hosts, capsys):
    code, out, _ = xrun(capsys, "--dry-run", "--precheck", "-H", str(two_hosts / "hosts"), str(two_hosts / "train.py"))
    assert code == 0 and ("precheck: once every agent is up, the network check (as xrun check --network) across the "
                          "2 nodes before any rank starts; a slow or unreachable node ends the job (exit 1)") in out
    code, out, _ = xrun(capsys, "--dry-run=json", "--precheck", "-H", str(two_hosts / "hosts"),
                        str(two_hosts / "train.py"))
    assert code == 0 and '"precheck": true' in out
    code, out, _ = xrun(capsys, "--dry-run", "-H", str(two_hosts / "hosts"), str(two_hosts / "train.py"))
    assert code == 0 and "precheck" not in out
    code, out, _ = xrun(capsys, "--dry-run", "--precheck", "--max_restarts", "2", "-H", str(two_hosts / "hosts"),
                        str(two_hosts / "train.py"))
    assert code == 0 and "before any rank starts; a slow or unreachable node ends the job (exit 1); again before " \
        "every restart\n" in out


@pytest.mark.parametrize("extra, said", [
    ((), "xrun: --precheck: needs at least 2 nodes to pair, the job has 1 (localhost)\n"),
    (("-H", "HOSTS", "--elastic"), "xrun: --precheck: does not go with --elastic: its nodes start as they come"),
    (("-H", "HOSTS", "--no_ssh", "--node_rank", "0"), "xrun: --precheck: is not supported in pod mode"),
])
def test_a_precheck_that_cannot_run_is_bad_input(two_hosts, capsys, extra, said):
    extra = [str(two_hosts / "hosts") if word == "HOSTS" else word for word in extra]
    code, _, err = xrun(capsys, "--dry-run", "--precheck", *extra, str(two_hosts / "train.py"))
    assert code == 2 and err.startswith(said) and err.count("\n") == 1, err
