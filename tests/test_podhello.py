"""Pod mode's hello policy (xrun.runner.pod.hello) inside the job state machine, as event tables: the plan digest
decides accept / refuse (exit 2, named) / stray (no word), and the verdict goes to every node. The key was proven
before a hello reaches the policy (xrun.runner.job.gate; tests/test_channel_security.py).
"""

from dataclasses import replace

import pytest

from xrun import __version__
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import (
    Admit,
    Done,
    HelloReceived,
    Ready,
    SendAccept,
    SendStart,
    SendStop,
    SendVerdict,
    ShowLine,
    Tick,
    TurnAway,
)
from xrun.runner.job.machine import Job
from xrun.runner.job.verdict import REFUSED_EXIT
from xrun.runner.pod.digest import make_digest
from xrun.runner.pod.hello import PodHello

HOSTS = ("n0", "n1", "n2")
FIELDS = {"xrun": __version__, "script": "train.py", "args": ["--lr", "0.1"], "launch": {"mode": "script"},
          "world": [[h, [0]] for h in HOSTS], "master": {"addr": "n0", "port": 29500}, "exports": [],
          "elastic": None}
MINE = make_digest(FIELDS)
OTHER = make_digest({**FIELDS, "script": "train2.py"})
CONFIG = JobConfig(hosts=HOSTS, join_timeout=30.0, shutdown_timeout=10.0, world_size=3, master_port=29500,
                   verdict_to_nodes=True)
POLICY = PodHello(MINE, "xrun-n0-29500", HOSTS)
KEY = (Admit, TurnAway, SendAccept, SendStart, SendStop, SendVerdict)


def hello(node, digest=MINE, conn=None):
    return HelloReceived(node, node if conn is None else conn, addr=f"10.0.0.{node}", peer=f"10.0.0.{node}",
                         xrun_version=__version__, digest=digest)


def play(policy, events):
    job = Job(CONFIG, now=0.0, policy=policy)
    actions = []
    for event in events:
        actions += job.handle(event, 1.0)
    return job, [a for a in actions if isinstance(a, KEY)]


CASES = [
    ("the same digest: accepted", POLICY, [hello(1)], [Admit(1, 1), SendAccept(1)]),
    ("no digest is a stray", POLICY, [hello(1, digest=None)], [TurnAway(1)]),
]


@pytest.mark.parametrize(("name", "policy", "events", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hello_policy(name, policy, events, expected):
    _, actions = play(policy, events)
    assert actions == expected


def test_a_refused_digest_ends_the_job_with_exit_2_naming_the_node_and_the_difference():
    reason = "node 2 (n2) runs another job: n2 runs train2.py; node 0 runs train.py"
    job, actions = play(POLICY, [hello(0), hello(1), hello(2, digest=OTHER)])
    assert actions[-2:] == [Admit(2, 2), SendStop((0, 1, 2), 15, 10.0, reason)]
    _, end = play(POLICY, [hello(0), hello(1), hello(2, digest=OTHER), Done(0, 143), Done(1, 143), Done(2, 143)])
    verdict = end[-1]
    assert isinstance(verdict, SendVerdict) and verdict.nodes == (0, 1, 2)
    assert verdict.verdict.exit_code == REFUSED_EXIT and verdict.verdict.failure.reason == reason


def test_every_node_gets_the_verdict_of_a_success():
    events = [hello(0), hello(1), hello(2), Ready(0), Ready(1), Ready(2), Done(0), Done(1), Done(2)]
    job, actions = play(POLICY, events)
    assert actions[-1] == SendVerdict((0, 1, 2), job.verdict()) and job.verdict().exit_code == 0


def test_a_node_joining_a_job_already_over_is_sent_the_verdict():
    job = Job(replace(CONFIG, join_timeout=5.0), now=0.0, policy=POLICY)
    job.handle(hello(0), 0.0)
    job.handle(hello(1, conn=1), 0.0)
    timeout = job.handle(Tick(), 6.0)
    assert any(isinstance(a, SendStop) for a in timeout)
    job.handle(Done(0, 143), 6.1)
    over = job.handle(Done(1, 143), 6.2)
    assert [a for a in over if isinstance(a, SendVerdict)] == [SendVerdict((0, 1), job.verdict())]
    late = job.handle(hello(2, conn=9), 7.0)
    assert [a for a in late if isinstance(a, KEY)] == [Admit(2, 9), SendVerdict((2,), job.verdict())]
    assert job.verdict().exit_code == 1 and "n2" in job.verdict().failure.reason


def test_head_mode_sends_no_verdict():
    job = Job(replace(CONFIG, verdict_to_nodes=False), now=0.0, policy=POLICY)
    actions = []
    for event in [hello(0), hello(1), hello(2), Ready(0), Ready(1), Ready(2), Done(0), Done(1), Done(2)]:
        actions += job.handle(event, 1.0)
    assert not any(isinstance(a, (SendVerdict, ShowLine)) for a in actions)
