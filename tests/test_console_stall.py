"""Supervision never waits on output (issue 25 §3).

A console that does not read (a pipe whose reader stopped, a terminal nobody scrolls) must not stop the
supervisor: the rank that fails still ends the job within the usual bound, with its exit code, and nothing is
left. The console's thread (xrun.common.output.writer) holds the ranks back while the job runs and, once it stops,
drops what does not fit and says how many lines.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT
from xrun.common.output.writer import ConsoleWriter

# rank 0 floods stdout (it blocks once its pipe is full and xrun stops reading it); rank 1 fails after 1 s
SCRIPT = """
import os, sys, time
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
if os.environ["RANK"] == "0":
    line = b"x" * 99 + b"\\n"
    while True:
        os.write(1, line * 100)
time.sleep(1.0)
sys.exit(7)
"""


class Blocking:
    """A console deliver that blocks until released, recording what it took."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.took: list[tuple[int, bytes]] = []

    def __call__(self, fd: int, data: bytes, route: object) -> bool:
        self.open.wait()
        self.took.append((fd, data))
        return True


def _wait_for(predicate) -> None:
    deadline = time.monotonic() + 5
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_stalled_console_holds_then_drops_and_says_how_many_once_it_reads():
    sink = Blocking()
    writer = ConsoleWriter(limit=100, stall_s=0.2, deliver_item=sink)
    writer.host = "h"
    assert writer.put(1, b"a" * 60 + b"\n")
    assert not writer.full
    assert writer.put(1, b"b" * 60 + b"\n")  # over the limit, but nothing is dropped while the job runs
    assert writer.full  # the rank group stops reading its ranks now
    writer.dropping = True  # the node is stopping
    assert writer.put(1, b"c\nd\n")
    assert writer.dropped == 2
    sink.open.set()  # the console reads again: what it missed is said in one line, after what it kept
    _wait_for(lambda: len(sink.took) == 3)
    assert sink.took[:2] == [(1, b"a" * 60 + b"\n"), (1, b"b" * 60 + b"\n")]
    assert sink.took[2][0] == 2 and sink.took[2][1].startswith(b"xrun[h]: 2 console lines dropped: ")
    assert writer.drain() and not writer.full and writer.dropped == 0


def test_the_end_waits_for_a_stalled_console_only_as_long_as_the_stall(capfd):
    sink = Blocking()
    writer = ConsoleWriter(limit=100, stall_s=0.2, deliver_item=sink)
    for n in range(3):
        writer.put(1, b"%d\n" % n * 40)
    started = time.monotonic()
    assert not writer.drain()  # the console took nothing for stall_s: xrun does not wait for it
    assert 0.15 < time.monotonic() - started < 2.0
    assert capfd.readouterr().err == ("xrun: 80 console lines dropped: the console did not take them (the log "
                                      "files under --log_dir and the failure report keep every line)\n")
    sink.open.set()
    _wait_for(lambda: sink.took)
    assert writer.drain() and sink.took == [(1, b"0\n" * 40)]  # the write in progress when the drain gave up


def test_a_slow_console_is_waited_for_while_it_takes_writes():
    took: list[bytes] = []

    def slow(fd: int, data: bytes, route: object) -> bool:
        time.sleep(0.05)  # each write takes a while, but every one goes through
        took.append(data)
        return True

    writer = ConsoleWriter(limit=1 << 20, stall_s=0.2, deliver_item=slow)
    for n in range(10):  # 0.5 s in all, more than the stall: progress keeps the drain waiting
        writer.put(1, b"%d\n" % n)
    assert writer.drain()
    assert took == [b"%d\n" % n for n in range(10)] and writer.dropped == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("console", ["pipe", "pty"])
def test_a_console_that_never_reads_does_not_stop_supervision(tmp_path, console):
    script = tmp_path / "flood.py"
    script.write_text(SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    reader, stdout = os.pipe() if console == "pipe" else pty.openpty()  # nobody ever reads `reader`
    stderr = tmp_path / "stderr"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        with open(stderr, "wb") as err:
            started = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "xrun", "--nproc_per_node", "2", "--no_dedupe", "--no_local_rank",
                                     str(script), str(pids)], stdout=stdout, stderr=err, stdin=subprocess.DEVNULL,
                                    cwd=ROOT, env=env)
            try:
                code = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail(f"xrun blocked on its console: {stderr.read_text()[-2000:]}")
        took = time.monotonic() - started
    finally:
        os.close(reader)
        os.close(stdout)
    said = stderr.read_text()
    assert code == 7, said
    assert took < 8.0, said  # the rank fails at ~1 s: start, the stop and one stall (1 s) of the console
    ranks = [int(name) for name in os.listdir(pids)]
    assert len(ranks) == 2 and not [pid for pid in ranks if _alive(pid)]
    assert "console lines dropped" in said, said
