"""The watchdog's clean-up after a dead or frozen agent (xrun.launch.procs.watchdog): a real fork, a real pipe.

EOF on the pipe without ``done`` is what the agent's ``kill -9`` looks like to the watchdog; ``finish(clean=False)``
gives exactly that. A frozen agent is a real process stopped with SIGSTOP, or a real rank group whose loop hangs
in a callback while the rest of the process runs on (issue 33 §4). The cluster tests of the same promises:
tests/cluster/test_multinode.py (one node's agent killed, one frozen).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from xrun.launch.procs.proctable import read_proc
from xrun.launch.procs.watchdog import Watchdog, removed_if_the_agent_dies

# An agent in miniature: a watchdog (expecting beats when BOUND is set), one rank in its own session, then its
# loop, which beats each time it comes round.
AGENT = """
import contextlib, subprocess, sys, time
from xrun.launch.procs.watchdog import Watchdog, watched_for_freezes
bound = float(sys.argv[1])
with watched_for_freezes(bound) if bound else contextlib.nullcontext():
    dog = Watchdog.start(grace=1.0)
rank = subprocess.Popen(["sleep", "60"], start_new_session=True)
dog.watch(rank.pid)
print(rank.pid, flush=True)
while True:
    dog.beat()
    time.sleep(bound / 10 or 1)
"""

# A real rank group under the beat's bound whose loop hangs in a callback after HANG_AFTER s, while a thread of
# the same process goes on (as the channel's reader does): the watchdog must stop the rank all the same.
HUNG_LOOP = """
import sys, threading, time
from xrun.launch.procs.watchdog import watched_for_freezes
from xrun.launch.ranks.processes import RankProcess
from xrun.launch.ranks.supervise import RankGroup, SuperviseOptions
bound, hang_after = float(sys.argv[1]), float(sys.argv[2])
threading.Thread(target=lambda: [time.sleep(0.1) for _ in iter(int, 1)], daemon=True).start()
group = RankGroup([RankProcess(0, 0, ("sh", "-c", "echo $$; exec sleep 60"), {"PATH": "/bin:/usr/bin"})],
                  SuperviseOptions(host="h", prefix=False, quiet=False))
hang_at = time.monotonic() + hang_after
group.plugins.timers.add(lambda: hang_at, lambda: time.sleep(3600))
with watched_for_freezes(bound):
    group.run()
"""


def _made(tmp_path, name):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "rank0.json").write_text("{}")  # a rank's error file in it
    return directory


def _gone(dog):
    os.waitpid(dog.pid, 0)  # the watchdog has finished its sweep


def test_the_watchdog_removes_the_directory_of_an_agent_that_died(tmp_path):
    directory = _made(tmp_path, "errors")
    with removed_if_the_agent_dies(str(directory)):
        dog = Watchdog.start(grace=1.0)
        dog.finish(clean=False)  # EOF without "done": the agent died
    _gone(dog)
    assert not directory.exists()


def test_a_clean_goodbye_leaves_the_directory_to_the_agent(tmp_path):
    directory = _made(tmp_path, "errors")
    with removed_if_the_agent_dies(str(directory)):
        dog = Watchdog.start(grace=1.0)
        dog.finish(clean=True)
    assert directory.exists()  # the agent removes it itself (ErrorFiles.close)


def test_only_the_directories_of_the_block_the_watchdog_was_forked_in(tmp_path):
    earlier, later = _made(tmp_path, "earlier"), _made(tmp_path, "later")
    with removed_if_the_agent_dies(str(earlier)):
        pass  # an earlier attempt's directory, already given up
    dog = Watchdog.start(grace=1.0)
    with removed_if_the_agent_dies(str(later)):  # registered after the fork: not the watchdog's
        dog.finish(clean=False)
    started = time.monotonic()
    _gone(dog)
    assert earlier.exists() and later.exists() and time.monotonic() - started < 5


def _agent(bound):
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(bound)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=ROOT))
    return agent, int(agent.stdout.readline())


def _alive(pid):
    proc = read_proc(pid)
    return proc is not None and proc.alive  # killed, it stays a zombie of the frozen agent


@pytest.mark.parametrize("bound", [0.5, 0])
def test_a_frozen_agents_rank_is_stopped_only_when_it_beats(bound):
    agent, rank = _agent(bound)
    try:
        time.sleep(1.5)  # three bounds of a live agent: its beats keep its rank
        assert _alive(rank)
        agent.send_signal(signal.SIGSTOP)  # frozen, its pipe open
        deadline = time.monotonic() + 1.5 + 3 * bound
        while _alive(rank) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(rank) == (not bound)  # without the beat (a local run) a pause stays a pause
    finally:
        agent.kill()  # the watchdog stops what is left
        agent.wait()
    deadline = time.monotonic() + 5
    while _alive(rank):
        assert time.monotonic() < deadline, "the rank outlived its agent"
        time.sleep(0.05)


def test_a_rank_group_whose_loop_hangs_stops_beating_and_its_rank_is_stopped():
    bound, hang_after = 1.0, 1.0
    agent = subprocess.Popen([sys.executable, "-c", HUNG_LOOP, str(bound), str(hang_after)], stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        rank = int(agent.stdout.readline())
        started = time.monotonic()
        time.sleep(hang_after + bound / 2)
        assert _alive(rank)  # the loop beat until it hung, and the bound has not passed since
        deadline = started + hang_after + bound + 3.0  # the bound after the hang, the watchdog's TERM, some load
        while _alive(rank) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(rank), "a hung loop's rank ran on"
        assert agent.poll() is None  # the agent itself still runs, its loop hung: only the watchdog acted
    finally:
        agent.kill()
        agent.wait()
