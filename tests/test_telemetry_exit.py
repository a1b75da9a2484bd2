"""What a rank leaves at its exit (issue 37 §2, §6): its Flight Recorder and the traceback it dies of, written by
its ``sitecustomize`` before its socket goes, read by the agent when the socket is gone; a rank killed without its
exit path, and one that never served, each read as what they are."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

from tests.test_telemetry_records import DIED_IN_ALL_REDUCE, dump, entry, retired_up_to
from xrun.common.telemetry.records import RankCollectives, Reading, rank_collectives
from xrun.launch.telemetry.client import ENDPOINT_GONE, NO_ENDPOINT
from xrun.launch.telemetry.endpoints import LAST_RECORDS_SUFFIX, SITE_DIR, SOCKET_VARIABLE, Endpoints
from xrun.launch.telemetry.reads import RankReads
from xrun.launch.telemetry.site import sitecustomize


@pytest.fixture
def endpoints(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", "/tmp")  # a socket's path must be short
    made = Endpoints()
    yield made
    made.close()


def leave(endpoints: Endpoints, rank: int, left: dict, traceback: str | None) -> None:
    with open(endpoints.last_records(rank), "w") as f:
        json.dump({"traceback": traceback, "flight_recorder": left}, f)


def test_the_rank_and_the_agent_name_the_file_alike(endpoints):
    assert LAST_RECORDS_SUFFIX == sitecustomize.LAST_RECORDS_SUFFIX
    assert sitecustomize.last_records_path(endpoints.socket(12)) == endpoints.last_records(12)


def test_a_reading_takes_what_a_gone_rank_left_and_says_why_the_others_sent_none(endpoints):
    leave(endpoints, 0, retired_up_to(19, 20, 21), DIED_IN_ALL_REDUCE)
    killed = socket.socket(socket.AF_UNIX)
    killed.bind(endpoints.socket(2))  # the name stays, nobody listens: a rank killed without its exit path
    killed.close()
    leave(endpoints, 3, {"entries": [], "pg_config": {}, "pg_status": {}}, None)  # torch imported, no group made
    reading = RankReads("n0", endpoints, 4).reading([0, 1, 2, 3], 5.0)
    by_rank = {r.rank: r for r in reading.collectives}
    assert by_rank[0].problem is None and by_rank[0].where == "train.py:16 <module>"
    assert [(c.seq, c.state) for c in by_rank[0].groups[0].recent][-1] == (21, "failed")
    assert by_rank[1].problem == NO_ENDPOINT
    assert by_rank[2].problem == ENDPOINT_GONE
    assert by_rank[3].problem.startswith("no process group recorded")
    assert reading.at_exit == (0, 3) and reading.no_group == {1, 3} and reading.grouped
    assert reading.full[0]["at_exit"] and reading.full[0]["flight_recorder"]["entries"][-1]["retired"]
    # ranks that ended are read from what they left, never asked: the same records
    ended = RankReads("n0", endpoints, 4).reading([], 5.0, ended=[0, 1, 2, 3])
    assert ended.collectives == reading.collectives and ended.at_exit == (0, 3) and ended.no_group == {1, 3}


def test_a_reading_of_ranks_that_never_had_a_process_group_has_nothing_to_report(endpoints):
    leave(endpoints, 1, {"entries": []}, None)
    reading = RankReads("n0", endpoints, 3).reading([0, 1], 5.0)
    assert reading.no_group == {0, 1} and not reading.grouped
    leave(endpoints, 2, dump(entry(1)), None)
    assert RankReads("n0", endpoints, 3).reading([0, 1, 2], 5.0).grouped


def test_what_a_rank_left_that_cannot_be_read_is_its_problem(endpoints):
    with open(endpoints.last_records(0), "w") as f:
        f.write('{"flight_recorder": ')
    [record] = RankReads("n0", endpoints, 1).reading([0], 5.0).collectives
    assert record.problem == "the records left at exit are not JSON (JSONDecodeError)"


RANK = r'''
import os, signal, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
print("ready", flush=True)
how = sys.argv[1]
if how == "raise":
    raise RuntimeError("the script's own error")
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
'''


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("how", ["exit", "raise", "kill"])
def test_a_rank_leaves_its_records_private_at_exit_and_none_when_killed(endpoints, tmp_path, how):
    """A real rank (the sitecustomize on its PYTHONPATH, as xrun starts it): at a normal exit or an uncaught
    exception it leaves rank<N>.last.json, mode 0600, with its collectives (and the traceback it died of), and
    its socket's name goes; SIGKILLed it leaves none, and its socket's name stays (the agent says it is gone)."""
    pytest.importorskip("torch")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "PYTHONPATH": SITE_DIR, SOCKET_VARIABLE: endpoints.socket(0), "TORCH_FR_BUFFER_SIZE": "1000"}
    result = subprocess.run([sys.executable, str(script), how], env=env, capture_output=True, text=True, timeout=120)
    assert "ready" in result.stdout, result.stderr
    path = endpoints.last_records(0)
    if how == "kill":
        assert result.returncode == -signal.SIGKILL
        assert not os.path.exists(path) and os.path.exists(endpoints.socket(0))
        [record] = RankReads("n0", endpoints, 1).reading([0], 5.0).collectives
        assert record.problem == ENDPOINT_GONE
        return
    assert result.returncode == (1 if how == "raise" else 0)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(os.listdir(endpoints.directory)) == ["rank0.last.json"]  # the socket's name went, no .part
    reading = RankReads("n0", endpoints, 1).reading([0], 5.0)
    [record] = reading.collectives
    assert reading.at_exit == (0,) and [c.seq for c in record.groups[0].recent] == [1, 2, 3]
    assert all(c.finished for c in record.groups[0].recent)  # the script's own error is no collective's failure
    assert record.where == ("rank.py:12 <module>" if how == "raise" else None)


def test_settling_takes_the_last_word_of_a_rank_read_while_it_failed(endpoints):
    """Read while gloo's timeout failed it, a rank answered with its collective retired as if done; once it has
    exited, what it left says it died in it. A rank with nothing left keeps what it said."""
    reads = RankReads("n0", endpoints, 2)
    answered = rank_collectives("n0", 0, retired_up_to(20, 21))
    reading = Reading((answered, RankCollectives("n0", 1, problem=NO_ENDPOINT)), {0: {"flight_recorder": {}}},
                      no_group=frozenset({1}))
    leave(endpoints, 0, retired_up_to(20, 21), DIED_IN_ALL_REDUCE)
    settled = reads.settle(reading, [0, 1])
    [group] = settled.collectives[0].groups
    assert group.recent[-1].state == "failed" and group.last_completed == 20
    assert settled.collectives[1] == reading.collectives[1]
    assert settled.at_exit == (0,) and settled.full[0]["at_exit"] and settled.no_group == {1}
    assert reads.settle(reading, [1]) == reading
