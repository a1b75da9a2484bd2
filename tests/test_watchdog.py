"""The watchdog's clean-up of the agent's per-run directories (xrun.launch.procs.watchdog): a real fork, a real pipe.

EOF on the pipe without ``done`` is what the agent's ``kill -9`` looks like to the watchdog; ``finish(clean=False)``
gives exactly that. The cluster test of the same promise: tests/cluster/test_multinode.py
(``test_kill9_of_one_nodes_agent_ends_the_job_and_leaves_nothing_on_that_node``).
"""

from __future__ import annotations

import os
import time

from xrun.launch.procs.watchdog import Watchdog, removed_if_the_agent_dies


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
