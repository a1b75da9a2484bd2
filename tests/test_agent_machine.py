"""The agent's state machine (xrun.launch.session.machine) without sockets: tables of event sequences -> actions and
exit code, for head mode, --max_restarts, hot spares and pod mode, and a property over any sequence.

A step is an event, or a float that sets the clock for the events after it. Each row plays ``before`` (its
actions are not checked), then ``steps``, and compares every action, type included (the records are tuples: two of
different types with equal fields are equal as tuples), and, where the agent is over, its exit code.
"""

import signal
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.channel import Kind, message
from xrun.common.spec import ElasticOptions, NodeSpec, RankSpec, with_rendezvous
from xrun.launch.session.events import (
    Accept,
    AnswerProbe,
    AttemptEnded,
    CloseProbes,
    Delivered,
    Dump,
    Exit,
    ForwardSignal,
    JobEnded,
    JoinAgain,
    LinkLost,
    OrderGroup,
    OtherMessage,
    Ping,
    PortRule,
    Preflight,
    PreflightFailed,
    PreflightPassed,
    Probe,
    Restart,
    RunAttempt,
    Send,
    ShowLine,
    ShowStarted,
    ShowWaiting,
    Shutdown,
    Signal,
    Spec,
    SpecUnusable,
    Start,
    StartGroup,
    StopGroup,
    StopOrder,
    StopRanks,
    TakeStacks,
    Tick,
    Waiting,
    message_event,
)
from xrun.launch.session.machine import REFUSED, TURNED_AWAY, AgentMachine, Phase, engine_exit_code
from xrun.launch.session.pod import Node0, PodNode

TERM, KILL, INT = int(signal.SIGTERM), int(signal.SIGKILL), int(signal.SIGINT)
NODE = NodeSpec(host="a", node_rank=0, ranks=(RankSpec(0, 0, {}, ("/bin/true",)),))
PICK = PortRule(pick=True, port=29500)
HEAD = {}
ENGINE = {"engine": True}
RESTARTS = Spec(NODE, restarts=True, port=PICK)
POD = PodNode(node_rank=1, num_nodes=3, world_size=6, spec=replace(NODE, node_rank=1), master_addr="pod-0",
              master_port=29500, ready_port=None, restarts=False, verdict_wait=40.0, forward_console=True,
              node0=Node0("10.0.0.1", 29501, "pod-0"), join_timeout=60.0, digest={}, key=b"k" * 32)
POD0 = replace(POD, node_rank=0, spec=NODE, ready_port=PICK)
POD_RESTARTS = replace(POD, restarts=True)


def pod(node=POD):
    return {"pod": node, "join_deadline": 60.0}


def ready(port=None):
    return Send(message(Kind.READY, master_port=port))


def done(code, root=None, by=None):
    return Send(message(Kind.DONE, exit_code=code, root_cause=root, interrupted_by=by), final=True)


def error(text, code=None):
    return Send(message(Kind.ERROR, message=text, exit_code=code), final=True)


def run(addr="10.0.0.1", port=29501, count=0, spec=NODE):
    return RunAttempt(with_rendezvous(spec, addr, port, count))


PONG = Send(message(Kind.PONG))
PROBE = Probe(message(Kind.PROBE_OPEN, toward="10.0.0.2"))
AT_BARRIER = [Spec(NODE, port=PICK), PreflightPassed(29501)]
RUNNING = [*AT_BARRIER, Start("10.0.0.1", 29501)]
STANDING = [Spec(NODE, standby=True, restarts=True), PreflightPassed()]
POD_BARRIER = [Accept(), PreflightPassed()]
POD_RUNNING = [*POD_BARRIER, Start(None, None)]
NOT_ACCEPTED = ("the runner did not accept this agent (connection closed by the peer): the job was already ending, "
                "another agent holds this node's place, or the token is stale or wrong")


def lost(reason):
    return (f"lost node 0 (pod-0), which hosts the job's control channel: {reason}; this node's ranks are stopped "
            "(exit code 1)")


def typed(records):
    return [(type(r).__name__, r) for r in records]


def play(steps, machine):
    now, actions = 0.0, []
    for step in steps:
        if isinstance(step, float):
            now = step
        else:
            actions += machine.handle(step, now)
    return actions


CASES = [
    # -- head mode ----------------------------------------------------------------------------------------------
    ("the spec, the preflight with node 0's port, ready", HEAD, [], [Spec(NODE, port=PICK), PreflightPassed(29501)],
     [Preflight(NODE, PICK), ready(29501)], None),
    ("the barrier opens: the rendezvous filled in, the probes closed", HEAD, AT_BARRIER,
     [Start("10.0.0.1", 29501)], [CloseProbes(), run()], None),
    ("the attempt's end is done, then the exit with its code", HEAD, RUNNING, [AttemptEnded(3, root_cause=1), Delivered(True)],
     [done(3, root=1), Exit(3)], 3),
    ("pings are answered at the barrier and while the ranks run", HEAD, AT_BARRIER,
     [Ping(), Start("10.0.0.1", 29501), Ping()], [PONG, CloseProbes(), run(), PONG], None),
    ("a preflight that waits (--preload's imports) answers pings, and keeps the rest for after", HEAD, [Spec(NODE)],
     [Ping(), StopOrder(TERM, "b failed"), Ping(), PreflightPassed(), Delivered(True)],
     [PONG, PONG, ready(), CloseProbes(), done(143), Exit(143)], 143),
    ("losing the runner during the preflight ends the agent at once", HEAD, [Spec(NODE)],
     [LinkLost("closed"), PreflightPassed()], [Exit(1, "closed")], 1),
    ("--precheck's probes are answered at the barrier (one during the preflight after it), not once it opened", HEAD,
     [Spec(NODE)], [PROBE, PreflightPassed(), PROBE, Start("h", 1), PROBE],
     [ready(), AnswerProbe(PROBE.message), AnswerProbe(PROBE.message), CloseProbes(), run("h", 1)], None),
    ("a stop while the ranks run stops them, stacks first when asked", HEAD, RUNNING,
     [StopOrder(TERM, "rank 3 failed", stacks=True), StopOrder(KILL, "second SIGINT")],
     [StopRanks(TERM, "rank 3 failed", stacks=True), StopRanks(KILL, "second SIGINT")], None),
    ("the head's hang stop stops the ranks as hung", HEAD, RUNNING, [StopOrder(TERM, "no output", hung=True)],
     [StopRanks(TERM, "no output", hung=True)], None),
    ("a forwarded signal and a dump reach running ranks only", HEAD, AT_BARRIER,
     [Signal(10), Dump(4), Start("h", 1), Signal(10), Dump(5)],
     [CloseProbes(), run("h", 1), ForwardSignal(10), TakeStacks(5)], None),
    ("stopped at the barrier: done, exit 128+signal", HEAD, AT_BARRIER, [StopOrder(TERM, "b failed"), Delivered(True)],
     [CloseProbes(), done(143), Exit(143)], 143),
    ("a preflight finding is bad input: said with its code, the runner names the host; the agent exits with it", HEAD,
     [Spec(NODE)], [PreflightFailed("SCRIPT t.py: no such file", 2), Delivered(True)],
     [error("SCRIPT t.py: no such file", 2), Exit(2)], 2),
    ("bad input (a taken --master_port) travels with its exit code", HEAD, [Spec(NODE, port=PortRule(False, 29500))],
     [PreflightFailed("port 29500 is in use on a", 2), Delivered(True)],
     [error("port 29500 is in use on a", 2), Exit(2)], 2),
    ("a spec this agent cannot read: error, one line, its code", HEAD, [],
     [SpecUnusable("node spec version 9 is not 1", 2), Delivered(True)],
     [error("cannot use the node spec: node spec version 9 is not 1"),
      Exit(2, "cannot use the node spec: node spec version 9 is not 1")], 2),
    ("anything but a spec first ends the agent", HEAD, [], [Ping()], [Exit(1, "expected the node spec, got 'ping'")],
     1),
    ("a kind this agent does not know, first", HEAD, [], [OtherMessage("'hello'")],
     [Exit(1, "expected the node spec, got 'hello'")], 1),
    ("a runner that closes before the spec did not accept this agent", HEAD, [],
     [LinkLost("connection closed by the peer")], [Exit(1, NOT_ACCEPTED)], 1),
    ("a runner lost at the barrier: exit 1 with its reason", HEAD, AT_BARRIER, [LinkLost("runner silent for 10 s")],
     [CloseProbes(), Exit(1, "runner silent for 10 s")], 1),
    ("a runner lost while the ranks run: they are stopped, then the attempt's code", HEAD, RUNNING,
     [LinkLost("connection closed by the peer"), AttemptEnded(143, interrupted_by=TERM), Delivered(False)],
     [StopRanks(TERM, "lost the control channel to the runner: connection closed by the peer"), done(143, by=TERM),
      Exit(143)], 143),
    ("a verdict is no head-mode word at the barrier", HEAD, AT_BARRIER, [JobEnded(0), OtherMessage("'new'")], [], None),
    ("a start without the master is a runner this agent cannot follow", HEAD, AT_BARRIER, [Start(None, 29501)],
     [CloseProbes(), Exit(1, "the runner's start named no master address and port")], 1),
    # -- an engine's agent (mpirun, hydra, srun) ------------------------------------------------------------------
    ("engine: 0 once the done reached the runner", ENGINE, RUNNING, [AttemptEnded(7), Delivered(True)],
     [done(7), Exit(0)], 0),
    ("engine: the code stands when it did not", ENGINE, RUNNING, [AttemptEnded(7), Delivered(False)],
     [done(7), Exit(7)], 7),
    ("engine: 0 once an error reached the runner", ENGINE, [Spec(NODE)],
     [PreflightFailed("no such file", 2), Delivered(True)], [error("no such file", 2), Exit(0)], 0),
    ("engine: a runner lost at the barrier is exit 1", ENGINE, AT_BARRIER, [LinkLost("x")],
     [CloseProbes(), Exit(1, "x")], 1),
    # -- --max_restarts -------------------------------------------------------------------------------------------
    ("restarts: the attempt's end waits for the runner's word", HEAD, [RESTARTS, PreflightPassed(29501),
                                                                       Start("h", 29501)],
     [AttemptEnded(1), Delivered(True)], [done(1)], None),
    ("restarts: the preflight again, ready, the attempt's count", HEAD,
     [RESTARTS, PreflightPassed(29501), Start("h", 29501), AttemptEnded(1), Delivered(True)],
     [Ping(), StopOrder(TERM, "stale"), Restart(1, PICK), PreflightPassed(29502), PROBE, Start("h", 29502)],
     [PONG, Preflight(NODE, PICK), ready(29502), AnswerProbe(PROBE.message), CloseProbes(), run("h", 29502, 1)], None),
    ("restarts: the start's own count wins", HEAD,
     [RESTARTS, PreflightPassed(1), Start("h", 1), AttemptEnded(1), Delivered(True), Restart(1), PreflightPassed()],
     [Start("h", 2, restart_count=4)], [CloseProbes(), run("h", 2, 4)], None),
    ("restarts: the verdict ends the agent with its last attempt's code", HEAD,
     [RESTARTS, PreflightPassed(1), Start("h", 1), AttemptEnded(1), Delivered(True)], [JobEnded(1)], [Exit(1)], 1),
    ("restarts: stopped at the barrier, it waits for the restart and starts it", HEAD, [RESTARTS, PreflightPassed(1)],
     [StopOrder(TERM, "c failed"), Delivered(True), Restart(1, PICK), PreflightPassed(2), Start("h", 2, 1)],
     [CloseProbes(), done(143), Preflight(NODE, PICK), ready(2), CloseProbes(), run("h", 2, 1)], None),
    ("restarts: stopped at the barrier, then the verdict", HEAD, [RESTARTS, PreflightPassed(1)],
     [StopOrder(TERM, "x"), Delivered(True), JobEnded(1)], [CloseProbes(), done(143), Exit(143)], 143),
    ("restarts: a preflight that fails again ends the agent", HEAD,
     [RESTARTS, PreflightPassed(1), Start("h", 1), AttemptEnded(1), Delivered(True)],
     [Restart(1), PreflightFailed("SCRIPT gone", 2), Delivered(True)],
     [Preflight(NODE, None), error("SCRIPT gone", 2), Exit(2)], 2),
    ("restarts: a runner lost between attempts: the last attempt's code", HEAD,
     [RESTARTS, PreflightPassed(1), Start("h", 1), AttemptEnded(1), Delivered(True)], [LinkLost("closed")],
     [Exit(1)], 1),
    ("restarts: a restart before any attempt is stale", HEAD, AT_BARRIER, [Restart(1)], [], None),
    # -- hot spares -----------------------------------------------------------------------------------------------
    ("a spare: its preflight, then ready without a port", HEAD, [], [Spec(NODE, standby=True), PreflightPassed()],
     [Preflight(NODE, None, standby=True), ready()], None),
    ("a spare answers pings and probes, then takes a lost node's place", HEAD, STANDING,
     [Ping(), PROBE, Spec(NODE, restarts=True, port=PICK), PreflightPassed(29501), Start("h", 29501, 2)],
     [PONG, AnswerProbe(PROBE.message), CloseProbes(), Preflight(NODE, PICK), ready(29501), CloseProbes(),
      run("h", 29501, 2)], None),
    ("a spare the job ended without exits 0", HEAD, STANDING, [JobEnded(1)], [CloseProbes(), Exit(0)], 0),
    ("a spare told to stop exits 0", HEAD, STANDING, [StopOrder(TERM, "x")], [CloseProbes(), Exit(0)], 0),
    ("a spare whose preflight fails never stands by", HEAD, [], [Spec(NODE, standby=True), PreflightFailed("bad", 2),
                                                                 Delivered(True)],
     [Preflight(NODE, None, standby=True), error("bad", 2), Exit(2)], 2),
    ("a second standby spec is no place", HEAD, STANDING, [Spec(NODE, standby=True)], [], None),
    # -- what waits for the preflight and for the ranks ------------------------------------------------------------
    ("a stop during the preflight is taken up after it", HEAD, [Spec(NODE)],
     [StopOrder(TERM, "x"), PreflightPassed(), Delivered(True)], [ready(), CloseProbes(), done(143), Exit(143)], 143),
    ("a verdict while the ranks run waits for their end", pod(), POD_RUNNING,
     [JobEnded(1, "job failed: x"), AttemptEnded(143, interrupted_by=TERM)],
     [done(143, by=TERM), Exit(1, "job failed: x")], 1),
    # -- pod mode -------------------------------------------------------------------------------------------------
    ("pod: accept -> ready (no preflight of the node, its port) -> the barrier's status -> start", pod(), [],
     [Accept(), PreflightPassed(), Waiting(2, ("pod-2",), 12.0), 2.5, Start(None, None)],
     [Preflight(POD.spec, None), ready(), ShowWaiting(2, ("pod-2",), 12.0),
      ShowStarted(3, 6, 2.5, "pod-0", 29500), CloseProbes(), RunAttempt(POD.spec)], None),
    ("pod: node 0 settles rank 0's port at the accept", pod(POD0), [], [Accept(), PreflightPassed(29517)],
     [Preflight(NODE, PICK), ready(29517)], None),
    ("pod: node 0's pick reaches every node's ranks", pod(), POD_BARRIER, [Start(None, 29517)],
     [ShowStarted(3, 6, 0.0, "pod-0", 29517), CloseProbes(), run("pod-0", 29517, spec=POD.spec)], None),
    ("pod: an elastic node keeps its rendezvous", pod(replace(POD, spec=replace(POD.spec, elastic=ElasticOptions()))),
     POD_BARRIER, [Start(None, 29517)],
     [ShowStarted(3, 6, 0.0, "pod-0", 29517), CloseProbes(), RunAttempt(replace(POD.spec, elastic=ElasticOptions()))],
     None),
    ("pod: the verdict's exit code and line", pod(), POD_RUNNING, [AttemptEnded(0), Delivered(True), JobEnded(7, "job "
                                                                                                      "failed: y")],
     [done(0), Exit(7, "job failed: y")], 7),
    ("pod: node 0's server prints the report itself", pod(POD0), [], [JobEnded(7, "job failed: y")], [Exit(7)], 7),
    ("pod: a preflight failure at a restart travels and waits for the verdict", pod(), POD_RUNNING,
     [AttemptEnded(1), Delivered(True), Restart(1), PreflightFailed("SCRIPT gone", 2), JobEnded(1, "x")],
     [done(1), ShowLine("node 0 restarts the job on every node: attempt 1"), Preflight(POD.spec, None),
      error("SCRIPT gone", 2), CloseProbes(), Exit(1, "x")], 1),
    ("pod: node 0 says nothing of its own restart", pod(POD0), [*POD_BARRIER, Start(None, None), AttemptEnded(1)],
     [Restart(1, PICK)], [Preflight(NODE, PICK)], None),
    ("pod: a stop before the start is done with 128+signal; the verdict follows", pod(), POD_BARRIER,
     [StopOrder(TERM, "x"), Start(None, None), JobEnded(143, None)], [CloseProbes(), done(143), Exit(143)], 143),
    ("pod: a failed node exits with its own code if no verdict comes", pod(), POD_RUNNING,
     [10.0, AttemptEnded(3), 49.9, Tick(), 50.0, Tick()],
     [done(3), Exit(3, "no verdict from node 0 (pod-0) within 40 s; exiting with this node's own code 3")], 3),
    ("pod: a node that succeeded waits for the verdict without a bound", pod(), POD_RUNNING,
     [AttemptEnded(0), 1000.0, Tick()], [done(0)], None),
    ("pod: node 0 lost while the ranks run: they are stopped, exit 1", pod(), POD_RUNNING,
     [LinkLost("runner silent for 10 s"), AttemptEnded(143)],
     [StopRanks(TERM, "lost the control channel to the runner: runner silent for 10 s"), done(143),
      Exit(1, lost("runner silent for 10 s"))], 1),
    ("pod: node 0 lost at the barrier", pod(), POD_BARRIER, [LinkLost("connection closed by the peer")],
     [CloseProbes(), Exit(1, lost("connection closed by the peer"))], 1),
    ("pod: turned away without a word", pod(), [], [LinkLost("connection closed by the peer")], [Exit(1, REFUSED)], 1),
    ("pod: turned away with --max_restarts: hello again (said once) until --join_timeout", pod(POD_RESTARTS), [],
     [LinkLost("closed"), LinkLost("closed"), 60.0, LinkLost("closed")],
     [ShowLine(TURNED_AWAY), JoinAgain(), JoinAgain(), Exit(1, REFUSED)], 1),
    ("pod: a ping is a word: a close after it is node 0 lost", pod(), [Ping()], [LinkLost("closed")],
     [Exit(1, lost("closed"))], 1),
    # -- pod mode: this xrun's own signals --------------------------------------------------------------------------
    ("pod: node 0's signal is its server's", pod(POD0), POD_BARRIER, [Shutdown(TERM)], [], None),
    ("pod: a signal before the start fails the job from here", pod(), POD_BARRIER, [Shutdown(TERM), Start(None, None)],
     [CloseProbes(), done(143)], None),
    ("pod: a signal before the accept", pod(), [], [Shutdown(INT)], [done(130)], None),
    ("pod: a signal after this node's part is over", pod(), [*POD_RUNNING, AttemptEnded(0)], [Shutdown(TERM)],
     [Exit(143, "got SIGTERM after this node's part was over; exit code 143")], 143),
    ("pod: with --max_restarts a signal is this node's leave", pod(POD_RESTARTS), POD_BARRIER, [Shutdown(TERM)],
     [CloseProbes(), Exit(143, "got SIGTERM: this node leaves the job; node 0 restarts it and waits for this node to "
                               "come back (the same command, within --join_timeout)")], 143),
    ("pod: a signal while the ranks run is the rank group's; with --max_restarts it leaves after", pod(POD_RESTARTS),
     POD_RUNNING, [Shutdown(TERM), AttemptEnded(143, interrupted_by=TERM)],
     [done(143, by=TERM), Exit(143, "got SIGTERM: this node leaves the job; node 0 restarts it and waits for this "
                                    "node to come back (the same command, within --join_timeout)")], 143),
    ("pod: without, it waits for the verdict", pod(), POD_RUNNING, [Shutdown(TERM), AttemptEnded(143, interrupted_by=TERM)],
     [done(143, by=TERM)], None),
    ("head mode has no signals of its own here", HEAD, AT_BARRIER, [Shutdown(TERM)], [], None),
    ("--replica_groups: the head's stop and start of a group across nodes go to the running ranks", HEAD, RUNNING,
     [StopGroup(1), StartGroup(1, 2)], [OrderGroup(StopGroup(1)), OrderGroup(StartGroup(1, 2))], None),
    ("and before the ranks run they are no news", HEAD, AT_BARRIER, [StopGroup(1), StartGroup(1, 2)], [], None),
]


@pytest.mark.parametrize("config, before, steps, expected, exit_code", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_event_sequences(config, before, steps, expected, exit_code):
    machine = AgentMachine(**config)
    play(before, machine)
    assert typed(play(steps, machine)) == typed(expected)
    assert machine.exit_code == exit_code


@pytest.mark.parametrize("msg, event", [
    (message(Kind.SPEC, spec=NODE.to_json(), standby=True, max_restarts=2), Spec(NODE, standby=True, restarts=True)),
    (message(Kind.SPEC, spec=NODE.to_json(), pick_master_port=True, master_port=29500), Spec(NODE, port=PICK)),
    (message(Kind.START, master_addr="h", master_port=4000, restart_count=1), Start("h", 4000, 1)),
    (message(Kind.START, master_port=0), Start(None, None)),
    (message(Kind.STOP, signal=9, deadline=5.0, reason="r", stacks=True), StopOrder(9, "r", True)),
    (message(Kind.STOP), StopOrder(TERM, "the runner asked to stop")),
    (message(Kind.STOP, signal=15, reason="r", hung=True), StopOrder(TERM, "r", hung=True)),
    (message(Kind.RESTART, attempt=2, pick_master_port=False, master_port=0), Restart(2, None)),
    (message(Kind.VERDICT, exit_code=True, line=3), JobEnded(1, None)),  # fields of the wrong type read as absent
    (message(Kind.VERDICT, exit_code=7, line="job failed: x"), JobEnded(7, "job failed: x")),
    (message(Kind.WAITING, ready=1, missing=["b"], elapsed=2), Waiting(1, ("b",), 2.0)),
    (message(Kind.PROBE_OPEN, toward="h"), Probe(message(Kind.PROBE_OPEN, toward="h"))),
    (message(Kind.DUMP, id=3, reason="SIGQUIT"), Dump(3)),
    (message(Kind.SIGNAL, signal=10), Signal(10)),
    (message(Kind.SIGNAL, signal="USR1"), OtherMessage("'signal'")),
    (message(Kind.PING), Ping()),
    (message(Kind.STOP_GROUP, group=1), StopGroup(1)),
    (message(Kind.START_GROUP, group=1, restart=2), StartGroup(1, 2)),
    (message(Kind.START_GROUP, group=1), OtherMessage("'start_group'")),  # no restart count: no start
    (message(Kind.ACCEPT), Accept()),
    ({"type": "news"}, OtherMessage("'news'")),
])
def test_a_message_is_the_machines_event(msg, event):
    assert typed([message_event(msg)]) == typed([event])


@pytest.mark.parametrize("spec, problem, code", [
    ({**NODE.to_json(), "version": 9}, "node spec: version 9 is not 1; install the same xrun on every node", 2),
    ({**NODE.to_json(), "ranks": [{}]}, "KeyError: 'rank'", 1),
    ("spec", "AttributeError: 'str' object has no attribute 'get'", 1),
])
def test_a_spec_this_agent_cannot_read_says_why(spec, problem, code):
    assert typed([message_event(message(Kind.SPEC, spec=spec))]) == typed([SpecUnusable(problem, code)])


def test_engine_exit_code_is_zero_only_once_the_runner_has_the_result():
    assert engine_exit_code(9, delivered=True) == 0
    assert engine_exit_code(9, delivered=False) == 9


# -- any sequence ---------------------------------------------------------------------------------------------

EVENTS = st.one_of(
    st.sampled_from([Spec(NODE), Spec(NODE, standby=True), RESTARTS, SpecUnusable("x"), Accept(), Ping(), PROBE,
                     Dump(1), Signal(10), OtherMessage("'x'"), Tick(), Delivered(True), Delivered(False),
                     PreflightPassed(), PreflightPassed(29501), Start(None, None)]),
    st.builds(Start, st.sampled_from(["h", None]), st.sampled_from([29501, None]), st.sampled_from([None, 0, 2])),
    st.builds(StopOrder, st.sampled_from([TERM, KILL, INT]), st.just("r"), st.booleans()),
    st.builds(Restart, st.sampled_from([None, 1, 2]), st.sampled_from([None, PICK])),
    st.builds(JobEnded, st.integers(0, 255), st.sampled_from([None, "job failed: x"])),
    st.builds(Waiting, st.integers(0, 3), st.just(("b",)), st.floats(0, 100)),
    st.builds(LinkLost, st.just("closed")),
    st.builds(Shutdown, st.sampled_from([TERM, INT, int(signal.SIGHUP)])),
    st.builds(PreflightFailed, st.just("bad"), st.just(2)),
    st.builds(AttemptEnded, st.integers(0, 255), st.sampled_from([None, 0]), st.sampled_from([None, TERM])),
    st.floats(0, 200),
)
CONFIGS = st.sampled_from([HEAD, ENGINE, pod(), pod(POD0), pod(POD_RESTARTS)])


@settings(max_examples=400, deadline=None)
@given(CONFIGS, st.lists(EVENTS, max_size=40))
def test_any_sequence_ends_once_and_never_before_the_ranks_are_over(config, steps):
    """Never raises; once over, exactly one exit code, said once, and it never changes; nothing is asked after it;
    the agent never exits while its ranks run."""
    machine, now, exits, running = AgentMachine(**config), 0.0, [], False
    for step in steps:
        if isinstance(step, float):
            now = max(now, step)
            continue
        was_over = machine.exit_code is not None
        actions = machine.handle(step, now)
        if isinstance(step, AttemptEnded) and running:
            running = False
        assert not (was_over and actions)
        for action in actions:
            if isinstance(action, RunAttempt):
                assert not running
                running = True
            elif isinstance(action, Exit):
                assert not running, "the agent exits while its ranks run"
                exits.append(action.code)
        assert (machine.phase is Phase.RUNNING) == running
    assert len(exits) == (1 if machine.exit_code is not None else 0)
    assert machine.exit_code == (exits[0] if exits else None)
    assert (machine.phase is Phase.OVER) == (machine.exit_code is not None)
