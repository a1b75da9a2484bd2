"""The job state machine (xrun.runner.job.machine) without sockets: tables of event sequences -> actions and exit code.

A step is an event, or a float that sets the clock for the events after it. Each row plays ``before`` (its
actions are not checked), then ``steps``, and compares the actions that matter (sends, drops, lines: not the
status counters or pings) and, where the job is over, its exit code.
"""

import signal
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrun import __version__
from xrun.runner.job.barrier import reachable
from xrun.runner.job.config import ElasticRule, JobConfig
from xrun.runner.job.events import (
    Admit,
    AgentError,
    ConnectionLost,
    Done,
    Drop,
    Failure,
    Heard,
    HelloReceived,
    PrecheckDone,
    RankExited,
    Ready,
    Replacement,
    SendPing,
    SendSpec,
    SendStart,
    SendStop,
    SendVerdict,
    SessionEnded,
    ShowLine,
    ShowStarted,
    ShowWaiting,
    SignalReceived,
    Tick,
    TurnAway,
    Verdict,
)
from xrun.runner.job.hello_policy import Refusal, SendSpecs
from xrun.runner.job.last_words import report_lines, verdict_json
from xrun.runner.job.machine import Job
from xrun.runner.job.nodes import NodeState
from xrun.runner.network.node_results import NodeRow, PrecheckResult
from xrun.runner.network.node_verdicts import Figures, LinkVerdict, NodeVerdict
from xrun.runner.restart_options import RestartPolicy

HOSTS = ("a", "b", "c")
STATIC = JobConfig(hosts=HOSTS, join_timeout=30.0, shutdown_timeout=10.0, world_size=4)
SHORT_JOIN = replace(STATIC, join_timeout=8.0)  # within the keepalive's DEAD_AFTER: no pongs needed
ELASTIC = replace(STATIC, master_port=29500, elastic=ElasticRule(min_nodes=2, master_addr="a"))
RESTARTS = replace(STATIC, restart=RestartPolicy(max_restarts=1, min_attempt_s=0.0))
KEEP = replace(STATIC, keep_survivors=True)  # --on_rank_exit keep (issue 39 §3)
POD_LATE = replace(STATIC, verdict_to_nodes=True)  # pod mode: the verdict (or the stop) goes to every node
# --precheck --spares 1 without --max_restarts (issue 33): the spare d (agent 3) only replaces a node found bad
PRECHECK_SPARE = replace(STATIC, precheck=True, restart=RestartPolicy(spares=1), spares=("d",))
KEY = (SendSpec, SendStart, SendStop, Drop, TurnAway, ShowLine)
TERM, KILL = int(signal.SIGTERM), int(signal.SIGKILL)


def hello(node, *, conn=None, addr=None, version=__version__):
    return HelloReceived(node, node if conn is None else conn, addr=addr or f"10.0.0.{node + 1}",
                         peer=f"10.9.9.{node + 1}", xrun_version=version)


JOINED = [hello(0), hello(1), hello(2)]
STARTED = [*JOINED, Ready(0, 29501), Ready(1), Ready(2)]
ALL_DONE = [Done(0), Done(1), Done(2)]
STOPPED = [Done(0, 143), Done(1, 7), Done(2, 143)]  # after rank 2 on b exited with 7


# --precheck's verdicts on a node, and a result over the agents (the world's a, b, c, then the spares d, e)
OK = NodeVerdict(LinkVerdict.OK, Figures(0.05, 900.0))
SLOW = NodeVerdict(LinkVerdict.SLOW, Figures(0.06, 0.5), "throughput 0.5 MB/s < 0.5 x median 900.0")
GONE = NodeVerdict(LinkVerdict.UNREACHABLE, None, "refuses connections: connection to 10.0.0.3:4000 refused")


def checked(*verdicts):
    hosts = ("a", "b", "c", "d", "e")
    rows = tuple(NodeRow(hosts[i], "eth0", f"10.0.0.{i + 1}", v) for i, v in enumerate(verdicts))
    return PrecheckResult(tuple(range(len(verdicts))), rows, 1.5)


SPARE_UP = [*JOINED, hello(3), Ready(3), Ready(0, 29501), Ready(1), Ready(2)]  # PRECHECK_SPARE: the check runs
SPARE_STARTED = [*SPARE_UP, PrecheckDone(checked(OK, OK, OK, OK))]


def play(steps, job=None, config=STATIC, policy=None):
    job = job or Job(config, now=0.0, policy=policy)
    now, actions = job.now, []
    for step in steps:
        if isinstance(step, float):
            now = step
        else:
            actions += job.handle(step, now)
    return job, actions


def key(actions):
    return [a for a in actions if isinstance(a, KEY)]


def stop(nodes, reason, signum=TERM):
    return SendStop(nodes, signum, 10.0, reason)


CASES = [
    # -- the start barrier --------------------------------------------------------------------------------------
    ("barrier holds until every node is ready", STATIC, [], [*JOINED, Ready(0, 29501), Ready(1)],
     [SendSpec(0, pick_master_port=True), SendSpec(1, False), SendSpec(2, False)], None),
    ("barrier released by the last ready node", STATIC, [*JOINED, Ready(0, 29501), Ready(1)], [Ready(2)],
     [SendStart((0, 1, 2), "10.0.0.1", 29501)], None),
    ("node 0 on loopback: its name is the master", STATIC, [hello(0, addr="127.0.0.1"), hello(1), hello(2)],
     [Ready(0, 29501), Ready(1), Ready(2)], [SendStart((0, 1, 2), "a", 29501)], None),
    ("--master_addr and --master_port win", replace(STATIC, master_addr="head", master_port=29500), JOINED,
     [Ready(0, 1234), Ready(1), Ready(2)], [SendStart((0, 1, 2), "head", 29500)], None),
    ("every node done", STATIC, STARTED, ALL_DONE, [], 0),
    ("a node that exits non-zero on its own", STATIC, STARTED, [Done(0), Done(1, 3), Done(2)],
     [stop((2,), "agent on b exited with code 3")], 3),
    # -- failures -----------------------------------------------------------------------------------------------
    ("first failing rank stops every node", STATIC, STARTED,
     [RankExited(1, rank=2, local_rank=0, code=7), RankExited(0, 0, 0, signal=TERM, stopped=True), *ALL_DONE],
     [stop((0, 1, 2), "rank 2 (local 0) on b exited with code 7")], 7),
    ("a rank killed by a signal: 128 + signal", STATIC, STARTED,
     [RankExited(2, rank=3, local_rank=1, signal=int(signal.SIGSEGV)), *ALL_DONE],
     [stop((0, 1, 2), "rank 3 (local 1) on c was killed by SIGSEGV")], 139),
    ("later failures do not change the root cause", STATIC, STARTED,
     [RankExited(1, 2, 0, code=7), RankExited(2, 3, 1, code=9), AgentError(0, "boom"), Done(2, 9), Done(1, 7),
      Done(0, 1)],
     [stop((0, 1, 2), "rank 2 (local 0) on b exited with code 7")], 7),
    ("a clean rank exit is no failure", STATIC, STARTED, [RankExited(1, 2, 0, code=0), *ALL_DONE], [], 0),
    ("an agent error", STATIC, STARTED, [AgentError(1, "cannot bind cores"), *ALL_DONE],
     [stop((0, 1, 2), "agent on b: cannot bind cores")], 1),
    ("an agent error that names its host names it once", STATIC, STARTED,
     [AgentError(0, "--master_port: port 29500 is already in use on a by pid 9", 2), *ALL_DONE],
     [stop((0, 1, 2), "--master_port: port 29500 is already in use on a by pid 9")], 2),
    ("lost node: exit 1 naming it", STATIC, STARTED, [ConnectionLost(2, "connection closed"), Done(0), Done(1)],
     [stop((0, 1), "lost node c: its agent's connection dropped (connection closed)")], 1),
    ("a done node's connection closing is no loss", STATIC, STARTED,
     [Done(2), ConnectionLost(2, "connection closed"), Done(0), Done(1)], [], 0),
    ("silent node: lost after DEAD_AFTER", STATIC, STARTED, [5.0, Heard(0), Heard(1), 10.5, Tick()],
     [Drop(2), stop((0, 1), "lost node c: no word from its agent for 10 s (network cut or node down?)")], None),
    ("join timeout names the missing hosts", SHORT_JOIN, [hello(0), hello(1), Ready(0, 29501), Ready(1)],
     [7.9, Tick(), 8.0, Tick(), Done(0), Done(1)],
     [stop((0, 1), "not ready within --join_timeout 8 s: c")], 1),
    ("session ended before its agent connected", STATIC, [hello(0), hello(1)],
     [SessionEnded("c", 255, ""), Done(0), Done(1)],
     [stop((0, 1), "the session to c exited with code 255 before its agent connected (see its output above)")], 255),
    ("one launcher for all nodes ended before any connected", STATIC, [], [SessionEnded(None, None, "pdsh died")],
     [], 1),
    ("a session ending after its agent connected waits for the connection", STATIC, STARTED,
     [SessionEnded("c", 0), Done(0), Done(1), Done(2)], [], 0),
    # -- signals ------------------------------------------------------------------------------------------------
    ("SIGINT: every node stopped, 130", STATIC, STARTED, [SignalReceived(int(signal.SIGINT)), *ALL_DONE],
     [ShowLine("got SIGINT; stopping every node"), stop((0, 1, 2), "xrun got SIGINT")], 130),
    ("second SIGINT: SIGKILL", STATIC, STARTED, [SignalReceived(int(signal.SIGINT)), Done(0),
                                                 SignalReceived(int(signal.SIGINT))],
     [ShowLine("got SIGINT; stopping every node"), stop((0, 1, 2), "xrun got SIGINT"),
      stop((1, 2), "second SIGINT", KILL)], None),
    ("SIGTERM after a failure keeps the stop and the root cause's code", STATIC, STARTED,
     [RankExited(1, 2, 0, code=7), SignalReceived(TERM), *ALL_DONE],
     [stop((0, 1, 2), "rank 2 (local 0) on b exited with code 7"), ShowLine("got SIGTERM; already stopping every node")],
     7),
    # issue 37 §4: a Ctrl-C while xrun stops the job for a lost node; the loss stays the root cause
    ("SIGINT while stopping for a lost node: the loss is the cause, exit 1", STATIC, STARTED,
     [ConnectionLost(2, "connection closed"), SignalReceived(int(signal.SIGINT)), Done(0, 130), Done(1, 130)],
     [stop((0, 1), "lost node c: its agent's connection dropped (connection closed)"),
      ShowLine("got SIGINT; already stopping every node")], 1),
    ("a node lost after SIGINT: the signal is the cause, 130", STATIC, STARTED,
     [SignalReceived(int(signal.SIGINT)), ConnectionLost(2, "connection closed"), Done(0, 130), Done(1, 130)],
     [ShowLine("got SIGINT; stopping every node"), stop((0, 1, 2), "xrun got SIGINT"),
      ShowLine("c: its agent's connection dropped (connection closed)")], 130),
    ("a repeated SIGTERM (GNU timeout signals xrun and its group) is one stop, one line", STATIC, STARTED,
     [SignalReceived(TERM), SignalReceived(TERM), *ALL_DONE],
     [ShowLine("got SIGTERM; stopping every node"), stop((0, 1, 2), "xrun got SIGTERM")], 143),
    ("stop deadline passing marks nodes lost", STATIC, [*STARTED, SignalReceived(TERM)],
     [Done(0), 14.0, Heard(1), Heard(2), 15.0, Tick()],
     [ShowLine("b: did not stop before the deadline"), Drop(1), ShowLine("c: did not stop before the deadline"),
      Drop(2)], 143),
    ("signal before any agent connected", STATIC, [], [SignalReceived(int(signal.SIGHUP))],
     [ShowLine("got SIGHUP; stopping every node")], 129),
    # -- hellos -------------------------------------------------------------------------------------------------
    ("a second hello for a node is turned away", STATIC, [hello(0)], [hello(0, conn=7)],
     [ShowLine("ignored a second agent for node 0 (a) from 10.9.9.1"), TurnAway(7)], None),
    ("a hello while stopping is turned away", STATIC, [hello(0), SignalReceived(TERM)], [hello(1, conn=8)],
     [ShowLine("turned away node 1 (b)'s agent from 10.9.9.2: it came after the job began stopping"), TurnAway(8)],
     None),
    ("a second hello while stopping is still a second one", STATIC, [hello(0), SignalReceived(TERM)],
     [hello(0, conn=8)], [ShowLine("ignored a second agent for node 0 (a) from 10.9.9.1"), TurnAway(8)], None),
    ("another xrun version is named", STATIC, [], [hello(1, version="0.0.1")],
     [ShowLine(f"b runs xrun 0.0.1, this is {__version__}"), SendSpec(1, False)], None),
    # -- --max_restarts, and pod mode's late node (the machine's restart and rejoin rules) ----------------------
    ("--max_restarts: a rank failure restarts every node", RESTARTS, STARTED, [RankExited(1, 2, 0, code=7), *STOPPED],
     [stop((0, 1, 2), "rank 2 (local 0) on b exited with code 7"),
      ShowLine("restarting the job on every node: attempt 1 of 2 (after: rank 2 (local 0) on b exited with code 7)")],
     None),
    ("--max_restarts: the last attempt's failure ends the job", RESTARTS,
     [*STARTED, RankExited(1, 2, 0, code=7), *STOPPED, Ready(0, 29501), Ready(1), Ready(2)],
     [RankExited(1, 2, 0, code=7), *STOPPED], [stop((0, 1, 2), "rank 2 (local 0) on b exited with code 7")], 7),
    ("--max_restarts: a node joining a stopping attempt is told to stop after its spec", RESTARTS,
     [hello(0), hello(1), Ready(0, 29501), Ready(1), RankExited(1, 2, 0, code=7)], [hello(2)],
     [SendSpec(2, False), stop((2,), "rank 2 (local 0) on b exited with code 7")], None),
    ("pod mode: a node late for a stopping job is admitted to be told the stop", POD_LATE,
     [hello(0), hello(1), SignalReceived(TERM)], [hello(2)], [stop((2,), "the job is stopping")], None),
    # -- --precheck --spares without --max_restarts (issue 33): a spare replaces only a node found bad before the start
    ("--precheck --spares, no restarts: the spare stands by for the check", PRECHECK_SPARE, JOINED,
     [hello(3), Ready(3)],
     [SendSpec(3, False, standby=True),
      ShowLine("spare d is standing by (hot: it takes the place of a node --precheck finds bad before the start)")],
     None),
    ("--precheck --spares, no restarts: a bad node's place goes to the spare before any rank starts", PRECHECK_SPARE,
     SPARE_UP, [PrecheckDone(checked(OK, SLOW, OK, OK)), Ready(3), Done(0), Done(3), Done(2)],
     [ShowLine("precheck: 1 node(s) bad: b slow: throughput 0.5 MB/s < 0.5 x median 900.0 (best pair 0.060 ms, "
               "0.5 MB/s); hot spares take their places (checked in 1.5 s)"),
      Drop(1),
      ShowLine("node 1 (b) is lost: the hot spare d takes its place (node rank 1, same slots); b is not used again"),
      SendSpec(3, False, 0, node_rank=1), SendStart((0, 3, 2), "10.0.0.1", 29501)], 0),
    ("--precheck --spares, no restarts: a node lost after the start ends the job, the spare standing", PRECHECK_SPARE,
     SPARE_STARTED, [ConnectionLost(2, "connection closed"), Done(0, 143), Done(1, 143)],
     [stop((0, 1), "lost node c: its agent's connection dropped (connection closed)")], 1),
    ("--precheck --spares, no restarts: a rank's failure ends the job, the spare unused", PRECHECK_SPARE,
     SPARE_STARTED, [RankExited(1, 2, 0, code=7), *STOPPED],
     [stop((0, 1, 2), "rank 2 (local 0) on b exited with code 7")], 7),
    # -- elastic ------------------------------------------------------------------------------------------------
    ("elastic: each node starts when ready", ELASTIC, JOINED, [1.5, Ready(1), 2.0, Ready(0)],
     [SendStart((1,), "a", 29500),
      ShowLine("b up after 1.5 s: its elastic agent joins the rendezvous (1/3 nodes up, --min_nodes 2)"),
      SendStart((0,), "a", 29500),
      ShowLine("a up after 2.0 s: its elastic agent joins the rendezvous (2/3 nodes up, --min_nodes 2)")], None),
    ("elastic: a lost node is a notice while min_nodes remain", ELASTIC, STARTED,
     [ConnectionLost(2, "connection closed"), Done(0), Done(1)],
     [ShowLine("lost node c: its agent's connection dropped (connection closed); 2 node(s) left, they "
               "re-rendezvous without it")], 0),
    ("elastic: below min_nodes the job fails", ELASTIC, [*STARTED, ConnectionLost(2, "connection closed")],
     [ConnectionLost(1, "connection closed"), Done(0)],
     [stop((0,), "lost node b: its agent's connection dropped (connection closed)")], 1),
    ("elastic: a session that never connected is a notice", ELASTIC, [hello(0), hello(1)],
     [SessionEnded("c", 255, "ssh connection lost")],
     [ShowLine("the session to c exited with code 255 before its agent connected (ssh connection lost); the "
               "elastic job goes on without it")], None),
    # -- --on_rank_exit keep: a rank lost while others run stops nobody; the last rank's failure is one ----------
    ("keep: a lost rank stops no node, its node's code is not read", KEEP, STARTED,
     [RankExited(1, rank=2, local_rank=0, signal=int(signal.SIGKILL)), Done(1, 137), RankExited(0, 0, 0, code=0),
      RankExited(0, 1, 1, code=0), RankExited(2, 3, 0, code=0), Done(0), Done(2)],
     [ShowLine("rank 2 (local 0) on b was killed by SIGKILL; the other ranks go on (--on_rank_exit keep)")], 0),
    ("keep: the job's last rank failing is the root cause", KEEP, STARTED,
     [RankExited(1, rank=2, local_rank=0, code=1), Done(1, 1), RankExited(0, 0, 0, code=0),
      RankExited(0, 1, 1, code=0), Done(0), RankExited(2, 3, 0, code=5), Done(2, 5)],
     [ShowLine("rank 2 (local 0) on b exited with code 1; the other ranks go on (--on_rank_exit keep)"),
      stop((2,), "rank 3 (local 0) on c exited with code 5")], 5),
    ("keep: a lost node still stops the job", KEEP, STARTED,
     [ConnectionLost(1, "connection closed"), Done(0, 143), Done(2, 143)],
     [stop((0, 2), "lost node b: its agent's connection dropped (connection closed)")], 1),
    ("elastic: the done nodes' exit code", ELASTIC, [*STARTED, ConnectionLost(2, "connection closed")],
     [Done(0, 0), Done(1, 0)], [], 0),
]


@pytest.mark.parametrize("config, before, steps, expected, exit_code", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_event_sequences(config, before, steps, expected, exit_code):
    job, _ = play(before, config=config)
    job, actions = play(steps, job)
    assert key(actions) == expected
    if exit_code is None:
        assert job.all_over_at is None
    else:
        assert job.all_over_at is not None and job.verdict().exit_code == exit_code


def test_keep_names_the_lost_ranks_in_the_verdict_and_summary():
    job, _ = play([*STARTED, RankExited(1, rank=2, local_rank=0, code=1), RankExited(0, 0, 0, code=0),
                   RankExited(0, 1, 1, code=0), RankExited(2, 3, 0, code=0), *ALL_DONE], config=KEEP)
    verdict = job.verdict()
    assert verdict.exit_code == 0 and verdict.failure is None and verdict.lost_ranks == (2,)
    failed, _ = play([*STARTED, RankExited(1, rank=2, local_rank=0, code=1), RankExited(0, 0, 0, code=0),
                      RankExited(0, 1, 1, code=0), RankExited(2, 3, 0, code=3), *ALL_DONE], config=KEEP)
    assert report_lines(failed.verdict())[0] == ("job failed: rank 3 (local 0) on c exited with code 3; every node stopped "
                                                 "0.00 s later; rank 2 lost before it")


def test_without_restarts_a_spare_seated_by_the_precheck_is_in_the_record_and_the_standing_spare_told_the_end():
    """--precheck --spares 2, no --max_restarts (issue 33): the first check seats d in b's place; the job's one
    attempt carries it (summary.json, as with restarts); e, still standing at the end, is told the verdict."""
    config = replace(PRECHECK_SPARE, restart=RestartPolicy(spares=2), spares=("d", "e"))
    job, _ = play([*JOINED, hello(3), hello(4), Ready(3), Ready(4), Ready(0, 29501), Ready(1), Ready(2),
                   PrecheckDone(checked(OK, SLOW, OK, OK, OK)), Ready(3)], config=config)
    assert job.attempts.number == 0 and not job.config.restart.restarts
    job, actions = play([5.0, Done(0), Done(3), Done(2)], job)
    verdict = job.verdict()
    assert verdict.exit_code == 0 and verdict.restart_lines == () and report_lines(verdict) == []
    assert [a.replaced for a in verdict.attempts] == [(Replacement(1, "b", "d", 0),)]
    assert verdict.attempts[0].to_json()["replaced"] == [
        {"node_rank": 1, "lost_host": "b", "spare_host": "d", "attempt": 0}]
    assert [a for a in actions if isinstance(a, SendVerdict)] == [SendVerdict((4,), verdict)]  # e only: no restart


def test_without_restarts_a_node_lost_after_the_start_ends_the_job_and_the_end_line_names_the_flag():
    job, actions = play([*SPARE_STARTED, ConnectionLost(2, "connection closed"), Done(0, 143), Done(1, 143)],
                        config=PRECHECK_SPARE)
    verdict = job.verdict()
    assert verdict.exit_code == 1 and job.nodes[2].host == "c"  # d stood by: no restart, so no seat
    assert report_lines(verdict) == [
        "job failed: lost node c: its agent's connection dropped (connection closed) (exit code 1); every node "
        "stopped 0.00 s later",
        "1 node(s) lost (c) and 1 spare(s) on standby: without --max_restarts a spare takes only the place of a node "
        "--precheck finds bad before the start; give --max_restarts N to let one take a lost node's place at a restart"]
    assert [a for a in actions if isinstance(a, SendVerdict)] == [SendVerdict((3,), verdict)]  # d exits 0
    assert [a.replaced for a in verdict.attempts] == [()]


def test_without_restarts_more_lost_nodes_than_spares_say_only_that():
    job, _ = play([*SPARE_STARTED, ConnectionLost(1, "connection closed"), ConnectionLost(2, "connection closed"),
                   Done(0, 143)], config=PRECHECK_SPARE)
    assert job.verdict().restart_lines == ("2 node(s) lost (b, c) and 1 spare(s) on standby to take their places",)


def test_barrier_start_is_shown_with_the_master_and_time_to_join():
    job, actions = play([*JOINED, Ready(0, 29501), Ready(1), 2.5, Ready(2)])
    assert ShowStarted(3, 4, 2.5, "10.0.0.1", 29501) in actions
    assert {job.state(n) for n in range(3)} == {NodeState.RUNNING}


def test_the_waiting_status_names_the_missing_nodes_once_a_second():
    _, actions = play([hello(0), Ready(0, 1), 0.5, Tick(), 1.0, Tick(), 1.5, Tick(), 2.0, Tick()])
    assert [a for a in actions if isinstance(a, ShowWaiting)] == [
        ShowWaiting(1, ("b", "c"), 0.5), ShowWaiting(1, ("b", "c"), 1.5)]


def test_pings_go_to_connected_nodes_every_interval():
    _, actions = play([hello(0), hello(2), Tick(), 1.0, Tick(), 2.0, Tick(), Done(2), 4.0, Tick()])
    assert [a for a in actions if isinstance(a, SendPing)] == [SendPing((0, 2)), SendPing((0, 2)), SendPing((0,))]


def test_the_failure_names_the_rank_and_keeps_its_tail():
    job, _ = play([*STARTED, 3.0, RankExited(1, rank=2, local_rank=0, code=7, tail=("Traceback", "Boom")), 3.25,
                   *ALL_DONE])
    reason = "rank 2 (local 0) on b exited with code 7"
    assert job.failure == Failure("b", reason, 7, rank=2, tail=("Traceback", "Boom"))
    assert job.verdict() == Verdict(7, job.failure, None, stopped_after=0.25)


def test_numbered_nodes_go_by_the_host_names_they_report():
    """Pod mode without host names (issue 25 §6): ``node K`` until the hello, then the host name it reported; two
    pods reporting one name keep apart by rank."""
    numbered = replace(SHORT_JOIN, hosts=("node 0", "node 1", "node 2"), numbered=True)
    named = [hello(0)._replace(host="node1"), hello(1)._replace(host="node1"), RankExited(1, rank=1, local_rank=0,
             code=7, tail=())]
    job, actions = play([*named, 8.0, Tick()], config=numbered)
    assert [job.nodes[n].host for n in range(3)] == ["node1", "node 1 (node1)", "node 2"]
    assert job.failure.reason == "rank 1 (local 0) on node 1 (node1) exited with code 7"
    job, _ = play([hello(0)._replace(host="pod-a"), Ready(0, 1), 8.0, Tick()], config=numbered)
    assert job.failure.reason == "not ready within --join_timeout 8 s: node 1, node 2"
    unnamed, _ = play([hello(0)._replace(host="pod-a")], config=SHORT_JOIN)  # names from the plan stay
    assert unnamed.nodes[0].host == "a"


def test_join_timeout_failure_names_every_missing_host():
    job, _ = play([hello(0), Ready(0, 1), hello(1), 8.0, Tick()], config=SHORT_JOIN)  # b joined, not ready
    assert job.failure.host == "b, c" and job.failure.reason == "not ready within --join_timeout 8 s: b, c"


def test_the_verdict_stays_once_every_node_is_over():
    job, _ = play([*STARTED, *ALL_DONE])
    assert job.verdict().exit_code == 0
    play([SignalReceived(int(signal.SIGINT)), AgentError(0, "late"), 9.0, Tick()], job)
    assert job.verdict() == Verdict(0)


def test_lost_hosts_and_linger():
    job, _ = play([*STARTED, ConnectionLost(1, "connection closed"), 1.0, Done(0), Done(2)])
    assert job.lost_hosts() == {"b"}
    assert not job.linger_over(3.9) and job.linger_over(4.0)
    assert job.next_deadline() <= 4.0


@pytest.mark.parametrize("addr, host, nodes, expected", [
    ("10.0.0.1", "a", 3, "10.0.0.1"),
    ("127.0.1.1", "a", 3, "a"),
    ("::1", "a", 2, "a"),
    ("127.0.0.1", "a", 1, "127.0.0.1"),
    (None, "a", 1, "a"),
])
def test_node_0_address_for_the_master(addr, host, nodes, expected):
    assert reachable(addr, host, nodes) == expected


class RefuseNode1:
    """The pod-mode shape: a policy that refuses a hello (here by node rank) instead of sending a spec."""

    def answer(self, hello):
        if hello.node == 1:
            return Refusal("node 1 (b) was started with another plan: --num_gpus 4, not 2")
        return SendSpecs(pick_master_port=False).answer(hello)


def test_a_refused_hello_ends_the_job_with_2_naming_the_node():
    job, actions = play([hello(0), hello(1), Done(0), Done(1)], policy=RefuseNode1())
    assert Admit(1, 1) in actions and SendSpec(1, False) not in actions
    assert stop((0, 1), "node 1 (b) was started with another plan: --num_gpus 4, not 2") in actions
    assert job.verdict().exit_code == 2 and job.failure.host == "b"


# -- the report ---------------------------------------------------------------------------------------------------


TAIL = tuple(f"l{i}" for i in range(12))
REPORTS = [
    (Verdict(0), 0, []),
    (Verdict(0), 2, ["closed 2 connection(s) that did not prove this run's key"]),
    (Verdict(130, interrupted_by=2), 0, ["stopped by SIGINT (exit code 130)"]),
    (Verdict(1, Failure("c", "lost node c: gone", 1), interrupted_by=2, stopped_after=2.5), 0,
     ["job failed: lost node c: gone (exit code 1), then stopped by SIGINT while stopping every node; every node "
      "stopped 2.50 s later"]),
    (Verdict(7, Failure("b", "rank 2 (local 0) on b exited with code 7", 7, rank=2, tail=("t",)), interrupted_by=15),
     0, ["job failed: rank 2 (local 0) on b exited with code 7, then stopped by SIGTERM while stopping every node",
         "  [b:2] t"]),
    (Verdict(1, Failure("c", "lost node c: gone", 1)), 0, ["job failed: lost node c: gone (exit code 1)"]),
    (Verdict(1, Failure("c", "rank 0 (local 0) on c exited with code 17", 1)), 0,
     ["job failed: rank 0 (local 0) on c exited with code 17 (exit code 1)"]),
    (Verdict(7, Failure("b", "rank 2 (local 0) on b exited with code 7", 7, rank=2, tail=TAIL), stopped_after=0.123), 1,
     ["closed 1 connection(s) that did not prove this run's key",
      "job failed: rank 2 (local 0) on b exited with code 7; every node stopped 0.12 s later",
      *[f"  [b:2] l{i}" for i in range(2, 12)]]),
]


def test_a_sigint_while_stopping_for_a_lost_node_keeps_both_causes_in_order():
    """Issue 37 §4: the end line and summary.json say the node was lost first, then that the user interrupted."""
    job, _ = play([*STARTED, 1.0, ConnectionLost(2, "connection closed"), 2.0, SignalReceived(int(signal.SIGINT)),
                   3.5, Done(0, 130), Done(1, 130)])
    verdict = job.verdict()
    assert (verdict.exit_code, verdict.failure.host, verdict.interrupted_by) == (1, "c", signal.SIGINT)
    end = ("job failed: lost node c: its agent's connection dropped (connection closed) (exit code 1), then stopped "
           "by SIGINT while stopping every node; every node stopped 2.50 s later")
    assert report_lines(verdict) == [end]
    assert verdict_json(verdict) == {
        "end": end,
        "root_cause": {"reason": "lost node c: its agent's connection dropped (connection closed)", "host": "c",
                       "rank": None, "exit_code": 1},
        "interrupted_by": {"number": 2, "name": "SIGINT"},
    }
    alone = verdict_json(Verdict(130, interrupted_by=2))
    assert alone == {"end": "stopped by SIGINT (exit code 130)", "root_cause": None,
                     "interrupted_by": {"number": 2, "name": "SIGINT"}}


@pytest.mark.parametrize("verdict, strays, lines", REPORTS)
def test_report_lines(verdict, strays, lines):
    assert report_lines(verdict, strays=strays) == lines


# -- any sequence ---------------------------------------------------------------------------------------------------

NODE = st.integers(0, len(HOSTS) - 1)
MAYBE_INT = st.none() | st.integers(0, 255)
EVENTS = st.one_of(
    st.builds(hello, NODE, conn=st.integers(0, 20)),
    st.builds(Ready, NODE, MAYBE_INT),
    st.builds(RankExited, NODE, MAYBE_INT, MAYBE_INT, MAYBE_INT, st.none() | st.integers(1, 64), st.booleans()),
    st.builds(Done, NODE, st.integers(0, 255)),
    st.builds(AgentError, NODE, st.text(max_size=5)),
    st.builds(Heard, NODE),
    st.builds(ConnectionLost, NODE, st.just("connection closed")),
    st.builds(SessionEnded, st.none() | st.sampled_from(HOSTS), MAYBE_INT),
    st.builds(SignalReceived, st.sampled_from([1, 2, 15, 99])),
    st.just(Tick()),
    st.floats(0.0, 12.0),  # time passing
)


def replay(job, steps):
    """Play ``steps`` (events, or floats: seconds passing, unlike ``play``'s clock settings) into ``job``; after each
    event, yield its actions, each paired with the agents connected once it was taken (an Admit adds one; a Drop, and
    the ConnectionLost before its actions, take one away), so a test checks every send against the set of its moment.
    """
    now, connected = job.now, set()
    for step in steps:
        if isinstance(step, float):
            now += step
            continue
        if isinstance(step, ConnectionLost):
            connected.discard(step.node)
        taken = []
        for action in job.handle(step, now):
            if isinstance(action, Admit):
                connected.add(action.node)
            elif isinstance(action, Drop):
                connected.discard(action.node)
            taken.append((action, frozenset(connected)))
        yield taken


def targets(action):
    """The agents an action is sent to."""
    return set(getattr(action, "nodes", (getattr(action, "node", None),)))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([STATIC, ELASTIC]), st.lists(EVENTS, max_size=40))
def test_any_sequence_never_raises_and_once_over_has_one_exit_code(config, steps):
    job, verdict = Job(config, now=0.0), None
    ending = [SignalReceived(TERM), 1000.0, Tick()]  # whatever happened: stop, and let the deadline pass
    for taken in replay(job, [*steps, *ending]):
        for action, connected in taken:
            if isinstance(action, (SendSpec, SendStart, SendStop, SendPing)):
                assert targets(action) <= connected  # nothing is ever sent to a node without a connection
        if job.all_over_at is not None:
            verdict = verdict or job.verdict()
            assert job.verdict() == verdict
    assert verdict is not None and isinstance(verdict.exit_code, int)
