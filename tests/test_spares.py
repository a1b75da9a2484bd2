"""Hot spares (issue 23, ``--spares N``): pure.

The job state machine with spares played as event sequences (no sockets): standby, the seat of a spare in a lost
node's place at the restart, the lost host never used again, too few spares, the ``NodesFaulty`` seam for
``--precheck``; the plan's split of the hosts and the flags' bad input; the dry run.
"""

import json
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tests.test_job import GONE, JOINED, OK, SLOW, STATIC, checked, hello, play, replay, targets
from xrun.channel import DEAD_AFTER
from xrun.common.result.group_restart import GroupRestart
from xrun.errors import UsageError
from xrun.runner.job.events import (
    Admit,
    AgentError,
    ConnectionLost,
    Done,
    Drop,
    GroupFailed,
    GroupRestarted,
    GroupsMoved,
    GroupStopped,
    Heard,
    NodesFaulty,
    PrecheckDone,
    RankExited,
    Ready,
    Replacement,
    RunPrecheck,
    SendPing,
    SendRestart,
    SendSpec,
    SendStart,
    SendStop,
    SendVerdict,
    SessionEnded,
    ShowLine,
    SignalReceived,
    Tick,
    TurnAway,
)
from xrun.runner.job.last_words import report_lines
from xrun.runner.job.machine import Job
from xrun.runner.job.nodes import NodeState
from xrun.runner.plan import JobRequest, make_plan
from xrun.runner.replicas.moves import GroupLayout, GroupMove
from xrun.runner.restart_options import RestartPolicy

# world a, b, c (agents 0-2); spares d, e (agents 3, 4)
SPARES = replace(STATIC, restart=RestartPolicy(max_restarts=3, min_attempt_s=60.0, spares=2), spares=("d", "e"))
STANDBY = [*JOINED, hello(3), hello(4), Ready(3), Ready(4)]
RUNNING = [*STANDBY, Ready(0, 29501), Ready(1), Ready(2)]
C_LOST = [*RUNNING, ConnectionLost(2, "connection closed"), Done(0, 143), Done(1, 143)]


def lines(actions):
    return [a.text for a in actions if isinstance(a, ShowLine)]


def test_a_spares_hello_gets_a_standby_spec_and_its_ready_does_not_count_for_the_barrier():
    job, actions = play([*JOINED, hello(3)], config=SPARES)
    assert Admit(3, 3) in actions and SendSpec(3, False, standby=True) in actions
    job, actions = play([Ready(3), Ready(0, 29501), Ready(1)], job)
    assert "spare d is standing by (hot: it takes a lost node's place at a restart)" in lines(actions)
    assert not [a for a in actions if isinstance(a, SendStart)]  # node c is not ready: a spare is no substitute
    _, actions = play([Ready(2)], job)
    assert [a for a in actions if isinstance(a, SendStart)] == [SendStart((0, 1, 2), "10.0.0.1", 29501)]


def test_spares_are_pinged_and_a_silent_one_is_lost_without_stopping_the_job():
    job, actions = play([*RUNNING, 5.0, Tick()], config=SPARES)
    assert SendPing((0, 1, 2, 3, 4)) in actions
    job, actions = play([20.0, Heard(0), Heard(1), Heard(2), Tick()], job)  # a, b, c answer; d, e silent 20 s
    assert f"spare d is lost: no word from its agent for {DEAD_AFTER:g} s; 1 spare(s) left" in lines(actions)
    assert Drop(3) in actions and Drop(4) in actions and job.all_over_at is None
    job, actions = play([Done(0), Done(1), Done(2)], job)
    assert job.verdict().exit_code == 0
    assert [a.nodes for a in actions if isinstance(a, SendVerdict)] == [(0, 1, 2)]


def test_a_lost_node_is_replaced_by_the_first_spare_same_rank_same_slots():
    job, actions = play(C_LOST, config=SPARES)
    assert job.all_over_at is None
    assert "node 2 (c) is lost: the hot spare d takes its place (node rank 2, same slots); c is not used again" \
        in lines(actions)
    assert SendRestart((0, 1), 1, True, 0, node0=0) in actions  # the others restart over their own agents
    assert SendSpec(3, False, 0, node_rank=2) in actions  # the spare gets node 2's spec
    assert job.nodes[2].host == "d" and job.nodes[2].agent == 3 and job.state(2) is NodeState.JOINED
    job, actions = play([Ready(0, 40001), Ready(1), Ready(3)], job)
    assert SendStart((0, 1, 3), "10.0.0.1", 40001, attempt=1) in actions
    job, actions = play([70.0, Done(0), Done(1), Done(3)], job)
    verdict = job.verdict()
    assert verdict.exit_code == 0
    assert verdict.attempts[1].replaced == (Replacement(2, "c", "d", 1),)
    assert verdict.attempts[1].to_json()["replaced"] == [
        {"node_rank": 2, "lost_host": "c", "spare_host": "d", "attempt": 1}]
    assert "  attempt 1 (70.0 s): succeeded (on d in place of c (node 2))" in report_lines(verdict)
    assert [a for a in actions if isinstance(a, SendVerdict)] == [SendVerdict((0, 1, 3, 4), verdict)]
    assert "c" in job.lost_hosts()  # its session may stay open: it is cut off


# --replica_groups 3 --max_restarts 1 --spares 1: one group of 2 ranks on each of a, b, c; the spare d (agent 3)
GROUPS = replace(STATIC, spares=("d",), restart=RestartPolicy(spares=1), world_size=6,
                 groups=GroupLayout(1, (((0, 0),), ((1, 2),), ((2, 4),))))
GROUPS_RUNNING = [*JOINED, hello(3), Ready(3), Ready(0, 29501), Ready(1), Ready(2)]


def test_a_lost_nodes_groups_move_to_the_spare_which_alone_starts_and_no_other_node_is_stopped():
    job, actions = play([*GROUPS_RUNNING, 5.0, ConnectionLost(2, "connection reset")], config=GROUPS)
    assert not [a for a in actions if isinstance(a, (SendStop, SendRestart))]  # a and b hear nothing
    assert "node 2 (c) is lost: the hot spare d takes its place (node rank 2, same slots); c is not used again" \
        in lines(actions)
    assert ("the replica groups of c start again on d (group 2 restart 1 of 1); every other node's groups keep "
            "running") in lines(actions)
    assert GroupsMoved(2, "c", "d", "lost node c: its agent's connection dropped (connection reset)",
                       (GroupMove(2, 1, 4),)) in actions
    assert SendSpec(3, False, node_rank=2, group_restarts=((2, 1),)) in actions
    job, actions = play([Ready(3)], job)  # the spare's preflight passed: it alone starts, at node 0's endpoint
    assert [a for a in actions if isinstance(a, SendStart)] == [SendStart((3,), "10.0.0.1", 29501)]
    job, _ = play([60.0, Done(0), Done(1), Done(3)], job)
    verdict = job.verdict()
    assert verdict.exit_code == 0 and verdict.attempts[0].replaced == (Replacement(2, "c", "d", 0),)


@pytest.mark.parametrize(("before", "lost", "why"), [
    ([GroupRestarted(2, group=2, restart=1)], 2, "the restarts of its group(s) 2 are spent (--max_restarts 1)"),
    ([], 0, "node 0 hosts torchft's Lighthouse and xrun's channel, so no spare can take its place"),
    ([ConnectionLost(3, "gone")], 1, "no hot spare stands by (--spares)"),
])
def test_a_lost_node_whose_groups_cannot_move_fails_the_job_saying_why(before, lost, why):
    job, actions = play([*GROUPS_RUNNING, *before, 5.0, ConnectionLost(lost, "connection reset")], config=GROUPS)
    host = "abc"[lost]
    assert [a for a in actions if isinstance(a, SendStop)] and not [a for a in actions if isinstance(a, GroupsMoved)]
    assert job.failure.reason == (f"lost node {host}: its agent's connection dropped (connection reset); its replica "
                                  f"groups cannot start again elsewhere: {why}")
    job, _ = play([Done(n, 143) for n in range(3) if n != lost] + [6.0, Tick()], job)
    assert report_lines(job.verdict()) == [f"job failed: {job.failure.reason} (exit code 1); every node stopped 0.00 s "
                                           "later"]  # no word of --max_restarts: the groups' budgets are theirs


def test_the_replaced_agent_is_no_ones_its_late_words_and_hellos_change_nothing():
    job, _ = play(C_LOST, config=SPARES)
    job, actions = play([Done(2, 1), RankExited(2, rank=3, local_rank=0, code=9), hello(2, conn=7)], job)
    assert actions == [TurnAway(7)]
    assert job.state(2) is NodeState.JOINED and job.nodes[2].connected


def test_node_0_replaced_gets_the_port_to_pick_and_is_node_0_of_the_next_restart():
    steps = [*RUNNING, ConnectionLost(0, "connection closed"), Done(1, 143), Done(2, 143)]
    job, actions = play(steps, config=SPARES)
    assert SendSpec(3, True, 0, node_rank=0) in actions
    job, actions = play([Ready(3, 40002), Ready(1), Ready(2)], job)
    assert SendStart((3, 1, 2), "10.0.0.4", 40002, attempt=1) in actions  # d's address is the master's now
    job, actions = play([RankExited(1, rank=1, local_rank=0, code=3), Done(3, 143), Done(1, 3), Done(2, 143)], job)
    assert SendRestart((3, 1, 2), 2, True, 0, node0=3) in actions  # a rank's exit: the same nodes again


def test_a_rank_exit_is_not_a_node_fault_the_same_nodes_restart():
    job, _ = play(RUNNING, config=SPARES)
    job, actions = play([RankExited(1, rank=1, local_rank=0, code=7), Done(0, 143), Done(1, 7), Done(2, 143)], job)
    assert SendRestart((0, 1, 2), 1, True, 0) in actions
    assert not [a for a in actions if isinstance(a, SendSpec)] and len(job.spares.ready()) == 2


def test_a_node_whose_agent_fails_at_a_restart_is_replaced():
    steps = [*RUNNING, RankExited(1, rank=1, local_rank=0, code=7), Done(0, 143), Done(1, 7), Done(2, 143)]
    job, _ = play(steps, config=SPARES)
    job, actions = play([Ready(0, 40001), AgentError(1, "b: cannot use the node spec"), Ready(2),
                         Done(0, 143), Done(2, 143), ConnectionLost(1, "connection closed")], job)  # stopped: wait
    assert SendSpec(3, False, 0, node_rank=1) in actions
    assert job.nodes[1].host == "d"


def test_a_preflight_refusal_at_a_restart_ends_the_job_with_2_and_no_spare_takes_its_place():
    # issue 33 §2: what a node's preflight finds (its script gone, a link where a log file goes) is bad input
    steps = [*RUNNING, RankExited(1, rank=1, local_rank=0, code=7), Done(0, 143), Done(1, 7), Done(2, 143)]
    job, _ = play(steps, config=SPARES)
    job, actions = play([Ready(0, 40001), AgentError(1, "SCRIPT 'train.py': no such file in /w", 2), Ready(2),
                         Done(0, 143), Done(2, 143), ConnectionLost(1, "connection closed")], job)
    assert not [a for a in actions if isinstance(a, SendSpec)] and job.nodes[1].host == "b"
    assert job.all_over_at is not None and job.verdict().exit_code == 2
    assert job.verdict().failure.reason == "agent on b: SCRIPT 'train.py': no such file in /w"


def test_two_lost_nodes_one_spare_end_the_job_naming_both():
    config = replace(SPARES, spares=("d",), restart=replace(SPARES.restart, spares=1))
    steps = [*JOINED, hello(3), Ready(3), Ready(0, 29501), Ready(1), Ready(2),
             ConnectionLost(1, "connection closed"), ConnectionLost(2, "connection closed"), Done(0, 143)]
    job, actions = play(steps, config=config)
    verdict = job.verdict()
    assert job.all_over_at is not None and verdict.exit_code == 1
    assert verdict.restart_lines[0] == ("stopped restarting after 0 restart(s): 2 node(s) lost (b, c) and 1 spare(s) "
                                        "on standby to take their places")
    assert [a for a in actions if isinstance(a, SendVerdict)] == [SendVerdict((0, 3), verdict)]  # d exits too


def test_a_spare_that_fails_its_preflight_or_drops_is_lost_and_not_used():
    job, actions = play([*JOINED, hello(3), hello(4), AgentError(3, "d: no such interpreter"), Ready(4),
                         ConnectionLost(4, "connection closed")], config=SPARES)
    assert lines(actions)[0] == "spare d is lost: it cannot stand by: d: no such interpreter; 1 spare(s) left"
    assert lines(actions)[-1] == "spare e is lost: its agent's connection dropped (connection closed); 0 spare(s) left"
    job, _ = play([Ready(0, 1), Ready(1), Ready(2), ConnectionLost(2, "connection closed"), Done(0, 143),
                   Done(1, 143)], job)
    assert job.all_over_at is not None and job.verdict().exit_code == 1
    assert {"d", "e"} <= job.lost_hosts()


def test_a_spares_session_that_ends_before_it_joined_loses_it():
    _, actions = play([*JOINED, SessionEnded("e", 255, "ssh exited")], config=SPARES)
    assert lines(actions) == ["spare e is lost: its session ended before its agent joined (ssh exited); 1 spare(s) left"]


def test_a_signal_ends_the_job_and_tells_the_spares():
    job, actions = play([*RUNNING, SignalReceived(int(signal.SIGINT)), Done(0, 130), Done(1, 130), Done(2, 130)],
                        config=SPARES)
    assert job.verdict().exit_code == 130
    assert [a.nodes for a in actions if isinstance(a, SendVerdict)] == [(0, 1, 2, 3, 4)]
    _, actions = play([ConnectionLost(3, "connection closed"), SessionEnded("e", 0), 20.0, Tick()], job)
    assert lines(actions) == []  # told the verdict, the spares leave: no news


# -- the seam for --precheck (issue 24) ---------------------------------------------------------------------------

def test_nodes_faulty_before_the_start_are_replaced_at_once_and_the_barrier_waits_for_the_spares():
    job, actions = play([*STANDBY, Ready(0, 29501), Ready(1), NodesFaulty((1,), "cannot reach c's port")],
                        config=SPARES)
    assert Drop(1) in actions and SendSpec(3, False, 0, node_rank=1) in actions
    assert not [a for a in actions if isinstance(a, SendStart)]
    _, actions = play([Ready(2), Ready(3)], job)
    assert SendStart((0, 3, 2), "10.0.0.1", 29501) in actions
    assert job.attempts.number == 0 and job.attempts.replaced == (Replacement(1, "b", "d", 0),)


def test_nodes_faulty_beyond_the_spares_end_the_job_naming_them():
    job, actions = play([*STANDBY, NodesFaulty((0, 1, 2), "no route"), Done(0), Done(1), Done(2)], config=SPARES)
    verdict = job.verdict()
    assert job.all_over_at is not None and verdict.exit_code == 1
    assert verdict.failure.reason == "lost node a, b, c: no route"
    assert "3 node(s) lost (a, b, c) and 2 spare(s)" in verdict.restart_lines[0]


# -- the plan and the flags ---------------------------------------------------------------------------------------

WORLD = {"a": (0, 1), "b": (0, 1), "c": (0, 1), "d": (0,)}


def test_the_last_hosts_are_the_spares_outside_the_world():
    plan = make_plan(JobRequest(script="t.py", restart=RestartPolicy(2, spares=1)), WORLD, "ssh")
    assert [n.host for n in plan.nodes] == ["a", "b", "c"] and plan.spares == ("d",)
    assert plan.world_size == 6 and plan.agent_hosts == ("a", "b", "c", "d")


@pytest.mark.parametrize("spares, backend, message", [
    (4, "ssh", "--spares: 4 leaves no world left of the 4 selected host(s); at least one must run the job"),
    (5, "pdsh", "--spares: 5 leaves more spares than the 4 selected host(s); at least one must run the job"),
    (1, "openmpi", "--spares: the openmpi backend cannot start an agent on a spare"),
    (1, "slurm", "--spares: the slurm backend cannot start an agent on a spare"),
    (1, "local", "--spares: a local run is one node"),
])
def test_spares_the_plan_refuses(spares, backend, message):
    with pytest.raises(UsageError) as err:
        make_plan(JobRequest(script="t.py", restart=RestartPolicy(2, spares=spares)), WORLD, backend)
    assert str(err.value).startswith(message)


def xrun(tmp_path, *args, launcher=("--launcher", "ssh")):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\nc slots=2\n")
    return subprocess.run([sys.executable, "-m", "xrun", "-H", str(hostfile), *launcher, *args, "t.py"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("args, message", [
    (["--spares", "3", "--max_restarts", "2"], "--spares: 3 leaves no world left of the 3 selected host(s)"),
    (["--spares", "1"], "--spares: a spare takes the place of a node --precheck finds bad before the start, or of a "
     "lost node at a restart: give --precheck, --max_restarts N, or both"),
    (["--spares", "1", "--precheck", "--launcher", "openmpi"], "--spares: the openmpi backend cannot"),
    (["--spares", "1", "--max_restarts", "2", "--elastic"], "--spares: does not apply with --elastic"),
    (["--spares", "-1", "--max_restarts", "2"], "--spares: must be >= 0, not -1"),
    (["--spares", "99999999", "--max_restarts", "2"], "argument --spares"),
    (["--spares", "1", "--max_restarts", "2", "--launcher", "mpich"], "--spares: the mpich backend cannot"),
])
def test_bad_spares_one_line_exit_2_dry_run_included(tmp_path, args, message):
    for dry in ([], ["--dry-run"]):
        result = xrun(tmp_path, *dry, *args)
        assert result.returncode == 2 and result.stdout == ""
        assert len(result.stderr.splitlines()) == 1 and message in result.stderr, result.stderr


@pytest.mark.parametrize("args", [["--precheck", "--no_ssh", "--node_rank", "0"],
                                  ["--max_restarts", "1", "--pod", "--node_rank", "1"]])
def test_spares_in_pod_mode_are_refused_in_one_line_saying_why(tmp_path, args):
    """Pod mode: every node starts itself, so no host stands by; a lost node comes back instead (--max_restarts)."""
    for dry in ([], ["--dry-run"]):
        result = xrun(tmp_path, *dry, "--spares", "1", *args, launcher=())
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert result.stderr == ("xrun: --spares: does not apply in pod mode (--pod, --no_ssh, a pod platform): every "
                                 "node starts its own xrun, so none stands by outside the world; with --max_restarts "
                                 "a lost node other than node 0 comes back instead (its pod re-created with the same "
                                 "index)\n")


def test_the_dry_run_shows_the_world_the_spares_and_the_policy(tmp_path):
    result = xrun(tmp_path, "--dry-run", "--spares", "1", "--max_restarts", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "xrun dry run: 2 nodes, 4 ranks, backend ssh"
    assert "spares: c (hot: its agent starts with the job and waits; a lost node's place goes to it at a restart)" \
        in out
    assert any(line.startswith("restarts: up to 2 of the whole job") for line in out)
    assert "spare c: agent 2" in "\n".join(out)
    data = json.loads(xrun(tmp_path, "--dry-run=json", "--spares", "1", "--max_restarts", "2").stdout)
    assert data["world_size"] == 4 and [n["host"] for n in data["nodes"]] == ["a", "b"]
    assert data["spares"] == [{"host": "c", "agent": 2, "command": data["spares"][0]["command"]}]
    assert "--node_rank=2" in data["spares"][0]["command"]
    assert data["restarts"]["spares"] == 1


def test_the_dry_run_of_precheck_spares_without_restarts_says_what_a_spare_is_for(tmp_path):
    """--precheck --spares 1, no --max_restarts (issue 33): planned, and the dry run says a spare replaces only a node
    the check finds bad, and that a node lost after the start ends the job."""
    result = xrun(tmp_path, "--dry-run", "--spares", "1", "--precheck")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert not [line for line in out if line.startswith("restarts:")]
    assert "spares: c (hot: its agent starts with the job and waits; it takes the place of a node --precheck finds " \
        "bad before any rank starts; a node lost after the start ends the job (no restart without --max_restarts))" \
        in out
    assert "precheck: once every agent is up, the network check (as xrun check --network) across the 2 nodes and " \
        "the spares before any rank starts; a slow or unreachable node is replaced by a spare that passed (not a " \
        "restart), or, short of spares, ends the job (exit 1)" in out
    data = json.loads(xrun(tmp_path, "--dry-run=json", "--spares", "1", "--precheck").stdout)
    assert data["restarts"] == {"max_restarts": 0, "min_attempt_s": 60.0, "spares": 1} and data["precheck"] is True
    assert [n["host"] for n in data["nodes"]] == ["a", "b"] and [s["host"] for s in data["spares"]] == ["c"]


# -- any sequence -------------------------------------------------------------------------------------------------

AGENT = st.integers(0, 4)
EVENTS = st.one_of(
    st.builds(hello, AGENT, conn=st.integers(0, 20)),
    st.builds(Ready, AGENT, st.none() | st.integers(1, 9)),
    st.builds(RankExited, AGENT, st.none() | st.integers(0, 5), st.none(), st.integers(0, 9)),
    st.builds(Done, AGENT, st.sampled_from([0, 1, 143])),
    st.builds(AgentError, AGENT, st.just("preflight")),
    st.builds(ConnectionLost, AGENT, st.just("connection closed")),
    st.builds(GroupRestarted, AGENT, st.integers(0, 3), st.integers(1, 2)),
    st.builds(GroupFailed, AGENT, st.builds(GroupRestart, group=st.integers(0, 2), restart=st.integers(1, 2),
                                            budget=st.just(2), rank=st.integers(0, 5), cause=st.just("was killed"),
                                            at=st.just(1.0), others=st.just(()))),
    st.builds(GroupStopped, AGENT, st.integers(0, 2)),
    st.builds(SessionEnded, st.none() | st.sampled_from(["a", "c", "d", "e"]), st.none()),
    st.builds(NodesFaulty, st.lists(st.integers(0, 3), max_size=3).map(tuple), st.just("bad link")),
    st.sampled_from([PrecheckDone(checked(OK, OK, OK, OK, OK)), PrecheckDone(checked(OK, SLOW, OK, GONE, OK)),
                     PrecheckDone(checked(SLOW, GONE, OK, OK))]),
    st.just(Tick()),
    st.floats(0.0, 12.0),
)
# --precheck --spares 2 without --max_restarts (issue 33), and --replica_groups with 2 spares: the same property
PRECHECK_ONLY = replace(SPARES, restart=RestartPolicy(spares=2), precheck=True)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([SPARES, replace(SPARES, precheck=True), PRECHECK_ONLY,
                        replace(GROUPS, spares=("d", "e"), restart=RestartPolicy(spares=2)),
                        replace(GROUPS, spares=("d", "e"), restart=RestartPolicy(spares=2),
                                groups=GroupLayout(2, (((0, 0),), ((1, 2),), ((1, 3),))))]),
       st.lists(EVENTS, max_size=50))
def test_any_sequence_with_spares_never_raises_sends_only_to_the_connected_and_ends_once(config, steps):
    job, verdict = Job(config, now=0.0), None
    for taken in replay(job, [*steps, SignalReceived(int(signal.SIGTERM)), 1000.0, Tick()]):
        for action, connected in taken:
            if isinstance(action, (SendSpec, SendStart, SendStop, SendPing, SendRestart, SendVerdict)):
                assert targets(action) <= connected, action
        assert len({n.agent for n in job.nodes}) == 3  # one agent per node rank, never shared
        assert not {n.host for n in job.nodes} & {s.host for s in job.spares.standing.values()}
        if job.all_over_at is not None:
            verdict = verdict or job.verdict()
            assert job.verdict() == verdict
    assert verdict is not None and isinstance(verdict.exit_code, int)


# -- --precheck with hot spares (issue 24 x 23): the spares are checked beside the nodes ----------------------------

PRECHECKED = replace(SPARES, precheck=True)
CHECKING = [*STANDBY, Ready(0, 29501), Ready(1), Ready(2)]


def test_the_precheck_checks_the_standing_spares_too():
    _, actions = play(CHECKING, config=PRECHECKED)
    assert RunPrecheck((0, 1, 2, 3, 4), "10.0.0.1", ("a", "b", "c", "d", "e")) in actions


def test_a_node_the_precheck_finds_bad_is_replaced_by_a_spare_that_passed_then_the_ranks_start():
    job, _ = play(CHECKING, config=PRECHECKED)
    job, actions = play([PrecheckDone(checked(OK, SLOW, OK, OK, OK))], job)
    assert lines(actions)[0].startswith("precheck: 1 node(s) bad: b slow: ")
    assert lines(actions)[0].endswith("; hot spares take their places (checked in 1.5 s)")
    assert Drop(1) in actions and SendSpec(3, False, 0, node_rank=1) in actions
    assert not [a for a in actions if isinstance(a, (SendStart, SendStop))]
    _, actions = play([Ready(3)], job)
    assert [a for a in actions if isinstance(a, RunPrecheck)] == []  # the spare passed this check already
    assert SendStart((0, 3, 2), "10.0.0.1", 29501) in actions
    assert job.attempts.replaced == (Replacement(1, "b", "d", 0),)


def test_a_spare_the_precheck_finds_bad_is_dropped_and_another_takes_the_place():
    job, _ = play(CHECKING, config=PRECHECKED)
    job, actions = play([PrecheckDone(checked(OK, OK, GONE, GONE, OK))], job)
    assert lines(actions)[0].startswith("spare d is lost: precheck: d unreachable")
    assert SendSpec(4, False, 0, node_rank=2) in actions and Drop(3) in actions


def test_too_few_spares_that_passed_end_the_job_naming_the_bad_nodes():
    job, _ = play([*CHECKING, PrecheckDone(checked(OK, SLOW, GONE, OK, GONE)), Done(0, 143), Done(1, 143),
                   Done(2, 143)], config=PRECHECKED)
    verdict = job.verdict()
    assert verdict.exit_code == 1 and verdict.failure.host == "b, c"
    assert verdict.failure.reason.startswith("precheck: 2 of 3 node(s) bad, no rank started: b slow")


def test_the_precheck_waits_for_spares_still_joining_at_most_until_the_join_timeout():
    job, actions = play([*JOINED, hello(3), hello(4), Ready(0, 29501), Ready(1), Ready(2)], config=PRECHECKED)
    assert not [a for a in actions if isinstance(a, RunPrecheck)]  # d and e are in their preflight
    job, actions = play([Ready(3)], job)
    assert not [a for a in actions if isinstance(a, RunPrecheck)]
    job, actions = play([Ready(4)], job)
    assert RunPrecheck((0, 1, 2, 3, 4), "10.0.0.1", ("a", "b", "c", "d", "e")) in actions
    short = replace(PRECHECKED, join_timeout=8.0)  # within the keepalive's DEAD_AFTER: no pongs needed
    job, _ = play([*JOINED, hello(3), Ready(0, 29501), Ready(1), Ready(2), Ready(3), 7.0, Tick()], config=short)
    assert job.barrier.prechecking is False
    job, actions = play([9.0, Tick()], job)  # e never joined: past --join_timeout the check goes on without it
    assert RunPrecheck((0, 1, 2, 3), "10.0.0.1", ("a", "b", "c", "d")) in actions and job.failure is None


# -- --precheck before every attempt: a restart checks the nodes it will run on again -----------------------------

# attempt 0 prechecked and running; then b's rank fails and every node is over: attempt 1's barrier
FAILED = [*CHECKING, PrecheckDone(checked(OK, OK, OK, OK, OK)), 5.0, RankExited(1, rank=2, local_rank=0, code=1),
          Done(0, 143), Done(1, 1), Done(2, 143)]
RESTARTED = [*FAILED, Ready(0, 40001), Ready(1), Ready(2)]


def test_a_restart_runs_the_precheck_again_across_its_nodes_and_the_standing_spares():
    job, actions = play(FAILED, config=PRECHECKED)
    assert SendRestart((0, 1, 2), 1, True, 0, node0=0) in actions
    job, actions = play([Ready(0, 40001), Ready(1)], job)
    assert not [a for a in actions if isinstance(a, (RunPrecheck, SendStart))]
    job, actions = play([Ready(2)], job)
    assert RunPrecheck((0, 1, 2, 3, 4), "10.0.0.1", ("a", "b", "c", "d", "e")) in actions
    assert not [a for a in actions if isinstance(a, SendStart)]  # the barrier holds the ranks through it
    _, actions = play([6.0, PrecheckDone(checked(OK, OK, OK, OK, OK))], job)
    assert lines(actions) == ["precheck passed before attempt 1: 5 node(s) ok in 1.5 s, median 900.0 MB/s"]
    assert SendStart((0, 1, 2), "10.0.0.1", 40001, attempt=1) in actions


def test_a_node_gone_bad_by_the_restart_is_replaced_by_a_spare_before_any_rank_of_the_attempt():
    job, _ = play(RESTARTED, config=PRECHECKED)
    job, actions = play([6.0, PrecheckDone(checked(OK, SLOW, OK, OK, OK))], job)
    assert lines(actions)[0].startswith("precheck: 1 node(s) bad: b slow: throughput 0.5 MB/s")
    assert "node 1 (b) is lost: the hot spare d takes its place (node rank 1, same slots); b is not used again" \
        in lines(actions)
    assert Drop(1) in actions and SendSpec(3, False, 0, node_rank=1) in actions
    assert not [a for a in actions if isinstance(a, (SendStart, SendStop, SendRestart))]
    job, actions = play([Ready(3)], job)
    assert not [a for a in actions if isinstance(a, RunPrecheck)]  # d passed this very check
    assert SendStart((0, 3, 2), "10.0.0.1", 40001, attempt=1) in actions
    job, _ = play([70.0, Done(0), Done(3), Done(2)], job)
    verdict = job.verdict()
    assert verdict.exit_code == 0 and verdict.attempts[1].replaced == (Replacement(1, "b", "d", 1),)
    assert "  attempt 1 (64.0 s): succeeded (on d in place of b (node 1))" in report_lines(verdict)


def test_too_few_spares_that_passed_at_a_restart_end_the_job_naming_the_node_and_its_figures():
    job, _ = play([*RESTARTED, 6.0, PrecheckDone(checked(OK, SLOW, GONE, OK, GONE))], config=PRECHECKED)
    job, actions = play([Done(0, 143), Done(1, 143), Done(2, 143)], job)
    assert not [a for a in actions if isinstance(a, (SendStart, SendRestart))]
    verdict = job.verdict()
    assert verdict.exit_code == 1 and verdict.failure.host == "b, c" and verdict.failure.final
    assert verdict.failure.reason.startswith("precheck: 2 of 3 node(s) bad, no rank of attempt 1 started: b slow: "
                                             "throughput 0.5 MB/s")
    assert "  attempt 1 (1.0 s): " + verdict.failure.reason in report_lines(verdict)


def test_a_spare_seated_at_the_restart_is_checked_with_the_nodes_before_the_ranks_start():
    job, _ = play([*CHECKING, PrecheckDone(checked(OK, OK, OK, OK, OK)), ConnectionLost(2, "connection closed"),
                   Done(0, 143), Done(1, 143)], config=PRECHECKED)
    assert job.nodes[2].host == "d"
    job, actions = play([Ready(0, 40001), Ready(1)], job)
    assert not [a for a in actions if isinstance(a, (RunPrecheck, SendStart))]  # d, in c's place, still preparing
    _, actions = play([Ready(3)], job)
    assert RunPrecheck((0, 1, 3, 4), "10.0.0.1", ("a", "b", "d", "e")) in actions


def test_a_restart_does_not_wait_for_a_spare_that_never_joined():
    short = replace(PRECHECKED, join_timeout=8.0)
    job, actions = play([*JOINED, hello(3), Ready(0, 29501), Ready(1), Ready(2), Ready(3), 9.0, Tick()],
                        config=short)  # e never joined: attempt 0's check went on without it past --join_timeout
    assert RunPrecheck((0, 1, 2, 3), "10.0.0.1", ("a", "b", "c", "d")) in actions
    steps = [PrecheckDone(checked(OK, OK, OK, OK)), 9.5, Heard(3), RankExited(1, rank=2, local_rank=0, code=1),
             Done(0, 143), Done(1, 1), Done(2, 143), Ready(0, 40001), Ready(1), Ready(2)]
    _, actions = play(steps, job)
    assert RunPrecheck((0, 1, 2, 3), "10.0.0.1", ("a", "b", "c", "d")) in actions  # at once: e is not awaited


def test_a_node_joining_a_stopping_attempt_is_stopped_and_restarted_on_a_spare_that_was_still_joining():
    # c's session ends before its agent joined; a joins after the stop; the spare d is still in its preflight
    job, actions = play([hello(0), hello(3), SessionEnded("c", 7, "exit 7"), hello(1)], config=SPARES)
    assert job.stopping and Admit(1, 1) in actions
    assert [a for a in actions if isinstance(a, SendStop) and a.nodes == (1,)]  # told at once: the attempt stops
    job, actions = play([Ready(0, 1), Ready(1), Done(0, 143), Done(1, 143)], job)
    assert job.all_over_at is None and not [a for a in actions if isinstance(a, SendRestart)]  # d still joining
    job, actions = play([Ready(3)], job)
    assert SendSpec(3, False, 0, node_rank=2) in actions and SendRestart((0, 1), 1, True, 0) in actions


def test_a_spare_that_never_gets_ready_is_waited_for_at_most_the_join_timeout():
    short = replace(SPARES, join_timeout=8.0)
    job, _ = play([hello(0), hello(1), hello(3), Ready(0, 1), Ready(1), SessionEnded("c", 7), Done(0, 143),
                   Done(1, 143)], config=short)
    assert job.all_over_at is None
    job, _ = play([9.0, Tick()], job)
    assert job.all_over_at is not None and job.verdict().exit_code == 7  # the session's code
    assert "1 node(s) lost (c) and no spare(s) on standby" in job.verdict().restart_lines[0]
