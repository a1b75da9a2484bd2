"""The job's counts (``xrun.runner.job.nodes.Tally``, issue 15) always equal a scan of its nodes: the rules read the
counts after every message instead of scanning 10,000 nodes, so any drift would change a barrier or a verdict."""

import signal

from hypothesis import given, settings
from hypothesis import strategies as st

from xrun import __version__
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import (
    AgentError,
    ConnectionLost,
    Done,
    HelloReceived,
    RankExited,
    Ready,
    SessionEnded,
    SignalReceived,
    Tick,
)
from xrun.runner.job.machine import Job
from xrun.runner.job.nodes import OVER, UP, NodeState

HOSTS = ("a", "b", "c", "c")  # two nodes on one host: a session ending names both
CONFIG = JobConfig(hosts=HOSTS, join_timeout=30.0, shutdown_timeout=10.0, world_size=4)
NODE = st.integers(0, len(HOSTS) - 1)
EVENTS = st.one_of(
    NODE.map(lambda n: HelloReceived(n, n, addr="10.0.0.1", peer="10.0.0.1", xrun_version=__version__)),
    NODE.map(lambda n: Ready(n)),
    st.tuples(NODE, st.sampled_from([0, 7])).map(lambda t: RankExited(t[0], rank=t[0], local_rank=0, code=t[1],
                                                                      signal=None, stopped=False, tail=())),
    st.tuples(NODE, st.sampled_from([0, 143])).map(lambda t: Done(t[0], exit_code=t[1])),
    NODE.map(lambda n: AgentError(n, "boom")),
    NODE.map(lambda n: ConnectionLost(n, "closed")),
    st.sampled_from([*HOSTS, None]).map(lambda h: SessionEnded(h, 1, "")),
    st.just(SignalReceived(int(signal.SIGTERM))),
    st.just(Tick()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 20), EVENTS), max_size=30))
def test_counts_match_a_scan(steps):
    job = Job(CONFIG, now=0.0)
    clock = 0.0
    for delay, event in steps:
        clock += delay
        job.handle(event, clock)
        nodes = job.nodes
        assert nodes.up() == sum(1 for n in nodes if n.state in UP)
        assert nodes.left() == sum(1 for n in nodes if n.state not in OVER)
        assert nodes.running() == sum(1 for n in nodes if n.state is NodeState.RUNNING)
        for stopping in (False, True):
            scan = all(n.over or (stopping and not n.connected) for n in nodes)
            assert nodes.all_over(stopping=stopping) == scan
