"""Pod mode's restarts and returning nodes without sockets (issue 23): the machine's rules
(``xrun.runner.job.machine``'s pod-mode rules) played as event sequences, a node's place reopening (``NodeKeys.release``), the
plan digest's ``restarts``, and the ``SignalLatch`` that keeps a signal from its default action between owners.
"""

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, replace

from tests.conftest import ROOT
from tests.test_job import STARTED, STATIC, hello, play
from xrun.common.procs.signals import SHUTDOWN_SIGNALS, SignalLatch, owned_signals
from xrun.runner.job.events import (
    Admit,
    ConnectionLost,
    Done,
    Heard,
    RankExited,
    Ready,
    SendAccept,
    SendPing,
    SendRestart,
    SendStart,
    SendVerdict,
    ShowLine,
    SignalReceived,
    Tick,
    TurnAway,
)
from xrun.runner.job.hello_policy import Refusal
from xrun.runner.job.keys import NodeKeys
from xrun.runner.job.nodes import Nodes, NodeState
from xrun.runner.restart_options import RestartPolicy

POD = replace(STATIC, verdict_to_nodes=True, restart=RestartPolicy(max_restarts=2, min_attempt_s=0.0))
LOST_C = [*STARTED, 5.0, ConnectionLost(2, "connection closed"), Done(0, 143), Done(1, 143)]


@dataclass(frozen=True)
class Accept:
    """Pod mode's policy in short: every hello is accepted (its digest is xrun.runner.pod.hello's to check)."""

    refuse: frozenset = frozenset()  # the connections whose hello is another job's

    def answer(self, hello):
        if hello.conn in self.refuse:
            return Refusal(f"node {hello.node} runs another job")
        return SendAccept(hello.node)


def pod(steps, job=None, config=POD, policy=None):
    return play(steps, job, config=config, policy=policy or Accept())


def test_a_lost_node_restarts_the_job_and_the_next_barrier_waits_for_it():
    job, actions = pod(LOST_C)
    assert job.all_over_at is None  # not over: attempt 1 waits for node c
    assert ShowLine("restarting the job on every node: attempt 1 of 3 (after: lost node c: its agent's connection "
                    "dropped (connection closed))") in actions
    assert [job.state(n) for n in range(3)] == [NodeState.JOINED, NodeState.JOINED, NodeState.WAITING]
    job, actions = pod([Ready(0, 40001), Ready(1), 6.0, Tick()], job)
    assert not [a for a in actions if isinstance(a, SendStart)]  # held for c
    job, actions = pod([hello(2, conn=7), Ready(2)], job)
    assert Admit(2, 7) in actions and SendAccept(2) in actions
    assert SendStart((0, 1, 2), "10.0.0.1", 40001, attempt=1) in actions


def test_a_node_back_while_the_attempt_ends_is_parked_then_told_the_restart():
    job, _ = pod([*STARTED, ConnectionLost(2, "connection closed")])
    job, actions = pod([hello(2, conn=9)], job)
    assert actions == [Admit(2, 9), ShowLine("node 2 (c) is back: it joins the next attempt")]  # no accept, no stop
    assert job.state(2) is NodeState.DONE and job.all_over_at is None  # parked: not live, the attempt still ends
    job, actions = pod([Done(0, 143), Done(1, 143)], job)
    assert SendRestart((0, 1, 2), 1, True, 0) in actions and job.state(2) is NodeState.JOINED
    job, actions = pod([Ready(0, 40001), Ready(1), Ready(2)], job)
    assert SendStart((0, 1, 2), "10.0.0.1", 40001, attempt=1) in actions


def test_a_parked_node_is_pinged_while_it_waits():
    job, _ = pod([*STARTED, ConnectionLost(2, "connection closed"), hello(2, conn=9)])
    _, actions = pod([6.0, Tick()], job)
    assert SendPing((0, 1, 2)) in actions


def test_a_node_that_does_not_come_back_ends_the_job_named_after_join_timeout():
    job, _ = pod(LOST_C)
    alive = [step for t in (14.0, 23.0, 32.0) for step in (t, Heard(0), Heard(1), Tick())]  # pongs
    job, actions = pod([Ready(0, 40001), Ready(1), *alive, 36.0, Tick(), Done(0, 143), Done(1, 143)], job)
    verdict = job.verdict()
    assert job.all_over_at is not None and verdict.exit_code == 1
    assert verdict.failure.reason == "not ready within --join_timeout 30 s: c"
    assert verdict.restart_lines[0] == "stopped restarting after 1 restart(s): 1 node(s) lost (c)"  # no spares here
    assert [a for a in actions if isinstance(a, SendVerdict)] == [SendVerdict((0, 1), verdict)]


def test_node_0_lost_ends_the_job():
    job, _ = pod([*STARTED, ConnectionLost(0, "connection closed"), Done(1, 143), Done(2, 143)])
    assert job.all_over_at is not None and job.verdict().exit_code == 1
    assert job.verdict().restart_lines[0].startswith("stopped restarting after 0 restart(s): 1 node(s) lost (a)")


def test_a_second_agent_is_turned_away_while_the_first_ones_connection_is_open():
    _, actions = pod([*STARTED, hello(2, conn=9)])
    assert TurnAway(9) in actions and Admit(2, 9) not in actions


def test_without_restarts_a_lost_pod_node_is_not_taken_back():
    config = replace(POD, restart=RestartPolicy())
    job, actions = pod([*STARTED, ConnectionLost(2, "connection closed"), hello(2, conn=9)], config=config)
    assert TurnAway(9) in actions
    job, _ = pod([Done(0, 143), Done(1, 143)], job)
    assert job.all_over_at is not None and job.verdict().exit_code == 1


def test_a_node_back_with_another_job_is_turned_away_and_named():
    job, actions = pod([*STARTED, ConnectionLost(2, "connection closed"), hello(2, conn=9)], policy=Accept(refuse=frozenset({9, 10})))
    assert TurnAway(9) in actions and ShowLine("node 2 runs another job: turned away") in actions
    job, actions = pod([Done(0, 143), Done(1, 143), hello(2, conn=10)], job)  # at the next attempt's barrier too
    assert TurnAway(10) in actions and job.state(2) is NodeState.WAITING
    job.policy = Accept()
    _, actions = pod([hello(2, conn=11)], job)
    assert Admit(2, 11) in actions and SendAccept(2) in actions  # its place was kept for the right one


def test_a_node_that_first_joins_with_another_job_still_ends_the_job_with_2():
    job, _ = pod([hello(0), hello(1), hello(2, conn=9)], policy=Accept(refuse=frozenset({9, 10})))
    assert job.failure.exit_code == 2 and job.failure.final


def test_a_node_back_after_the_end_is_told_the_verdict():
    job, _ = pod([*STARTED, SignalReceived(int(signal.SIGTERM)), Done(0, 143), Done(1, 143),
                  ConnectionLost(2, "connection closed")])
    assert job.all_over_at is not None
    _, actions = pod([hello(2, conn=9)], job)
    assert Admit(2, 9) in actions and SendVerdict((2,), job.verdict()) in actions


def test_a_rank_failure_restarts_in_place_and_node_0_signal_is_never_restarted():
    crash = [*STARTED, RankExited(1, rank=1, local_rank=0, code=5), Done(0, 143), Done(1, 5), Done(2, 143)]
    job, actions = pod(crash)
    assert SendRestart((0, 1, 2), 1, True, 0) in actions
    job, actions = pod([*STARTED, SignalReceived(int(signal.SIGTERM)), Done(0, 143), Done(1, 143), Done(2, 143)])
    assert job.verdict().exit_code == 143 and not [a for a in actions if isinstance(a, SendRestart)]


def test_which_lost_nodes_the_next_attempt_cannot_wait_for():
    nodes = Nodes(("a", "b", "c"))
    for node in nodes:
        node.state, node.connected = NodeState.DONE, True
    nodes[2].state, nodes[2].connected = NodeState.LOST, False  # lost during the attempt just over
    assert len(nodes.faulty(rejoin=POD.rejoins)) == 0  # it may come back
    assert len(nodes.faulty(rejoin=replace(POD, verdict_to_nodes=False).rejoins)) == 1  # head mode: an agent gone is gone
    assert len(nodes.faulty(rejoin=replace(POD, restart=RestartPolicy()).rejoins)) == 1
    nodes[2].state = NodeState.WAITING  # awaited at that attempt's barrier, never came
    assert len(nodes.faulty(rejoin=POD.rejoins)) == 1
    nodes[2].state, nodes[0].connected = NodeState.LOST, False
    assert len(nodes.faulty(rejoin=POD.rejoins)) == 1  # node 0 hosts the channel


def test_a_place_reopens_only_when_released():
    keys = NodeKeys(3, shared=b"k" * 32)
    keys.claim(2)
    assert keys.for_node(2) is None
    keys.release(2)
    assert keys.for_node(2) == b"k" * 32


# -- the plan digest ----------------------------------------------------------------------------------------------


def test_restarts_are_in_the_digest_only_when_asked_for_and_differences_are_named():
    from tests.test_digest import digest
    from xrun.runner.pod.digest import first_difference

    plain = digest()
    assert "restarts" not in plain.fields
    with_restarts = digest(restart=RestartPolicy(max_restarts=3))
    assert with_restarts.fields["restarts"] == 3
    assert first_difference(with_restarts, plain, node_name="node2") == \
        "node2 has --max_restarts 0; node 0 has --max_restarts 3"


# -- signals between owners ---------------------------------------------------------------------------------------


def test_a_latched_signal_goes_to_the_next_owner_and_the_latch_hears_the_owners():
    latch = SignalLatch()
    heard = []
    with latch.installed(SHUTDOWN_SIGNALS):
        latch.listen(heard.append)
        os.kill(os.getpid(), signal.SIGTERM)  # no owner: recorded, no default action
        assert latch.count == 1 and heard == [signal.SIGTERM]
        got = []
        with owned_signals((signal.SIGTERM,), lambda s, _f: got.append(s)):
            assert got == [signal.SIGTERM]  # handed over at once
            os.kill(os.getpid(), signal.SIGTERM)
            assert got == [signal.SIGTERM, signal.SIGTERM] and latch.count == 2
        assert signal.getsignal(signal.SIGTERM) is latch  # the latch owns it again
        with owned_signals((signal.SIGTERM,), lambda s, _f: got.append(s)):
            assert len(got) == 2  # nothing new to hand over
    assert signal.getsignal(signal.SIGTERM) is not latch


GAP = """
import os, signal, sys
from xrun.launch.agent import run_node
from xrun.common.procs.signals import SignalLatch
from xrun.common.spec import AgentOptions, NodeSpec, RankSpec
class Hooks:  # the driver's side, which this test leaves out: a one-node job's, told nothing
    alone = True
    def attach(self, group, doctor=None):
        doctor.link = self
    def on_rank_exit(self, outcome): pass
    def on_result(self, result): pass
    def on_group_restart(self, restart): pass
    def on_group_failed(self, restart): pass
    def on_group_stopped(self, group): pass
with SignalLatch().installed() as latch:
    os.kill(os.getpid(), signal.SIGTERM)  # between the start barrier and the rank group
    rank = RankSpec(rank=0, local_rank=0, argv=(sys.executable, "-c", "import time; time.sleep(30)"), env={})
    spec = NodeSpec(host="localhost", node_rank=0, ranks=(rank,), options=AgentOptions(shutdown_timeout=2.0))
    print("code", run_node(spec, hooks=Hooks()), "heard", latch.count, flush=True)
"""


def test_a_signal_before_the_rank_group_owns_the_signals_stops_it_before_any_rank_starts():
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(GAP)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    assert "code 143 heard 1" in proc.stdout, proc.stdout + proc.stderr


def test_pod_mode_takes_max_restarts_and_the_dry_run_says_what_a_lost_node_may_do(tmp_path):
    from xrun.runner.cli import parse_request
    from xrun.runner.dryrun import restart_note
    from xrun.runner.planner import plan_job
    from xrun.runner.validate import validate

    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=1\nb slots=1\n")
    (tmp_path / "t.py").write_text("")
    plan = plan_job(parse_request(["-H", str(hosts), "--pod", "--node_rank", "1", "--max_restarts", "3",
                                   "--join_timeout", "600", str(tmp_path / "t.py")])[0])
    validate(plan)  # no longer refused (exit 2) in pod mode
    assert restart_note(plan)[1] == "restarts: a lost node other than node 0 may come back (the same command) within " \
                                    "--join_timeout 600 s; node 0's loss ends the job"
