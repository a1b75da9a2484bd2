"""A progress bar shows where the rank is now (issue 25 §1).

tqdm writes ``\\r`` *before* each state and leaves the state unfinished until the next update. The console
shows such an unfinished state once a settle found nothing more of it, prefixed, with the bytes its line end
would have written with it: a pipe gets the same bytes, earlier; log files stay raw.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from xrun.common.output.render import labelled
from xrun.common.output.streams import Console, RankStream
from xrun.common.output.writer import writer

STATES = (b"\r0/3", b"\r1/3", b"\r2/3", b"\r3/3")


class Pipe:
    """A console fd whose bytes the test reads back."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)

    def read(self) -> bytes:
        assert writer().drain()  # the console's thread writes (issue 25 §3): what was queued is there now
        try:
            return os.read(self.r, 1 << 16)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


@pytest.fixture
def pipe():
    made = Pipe()
    yield made
    made.close()


def console_on(pipe: Pipe, **options) -> Console:
    console = Console(prefix=True, quiet=False, host="h", **options)
    console._ok[pipe.w] = True  # the pipe stands for fd 1
    return console


def settled(console: Console) -> None:
    """What the supervisor's loop does when a settle passed and nothing more came."""
    console.settle()
    assert console.wait() == 0.0  # a state waits to be shown: the loop looks again at once
    console.show_progress()


def test_the_current_state_is_shown_once_settled_and_the_bytes_stay_the_same(pipe):
    console = console_on(pipe)
    bar = RankStream(-1, pipe.w, rank=0)
    for state in STATES:
        console.consume(bar, state)
    assert pipe.read() == b"[h:0] \r[h:0] 0/3\r[h:0] 1/3\r[h:0] 2/3\r"  # 3/3 waits for the settle
    console.show_progress()
    assert pipe.read() == b""  # not before a settle: more of it may be in the pipe
    settled(console)
    assert pipe.read() == b"[h:0] 3/3"  # the state the rank is in, while it works
    assert console.wait() is None  # shown: the loop sleeps again
    console.consume(bar, b" |###|")
    settled(console)
    assert pipe.read() == b" |###|"  # the state grew: the rest of it
    console.consume(bar, b"\n")
    assert pipe.read() == b"\n"  # written already: only its line end
    whole = b"".join(STATES) + b" |###|\n"
    assert b"[h:0] \r[h:0] 0/3\r[h:0] 1/3\r[h:0] 2/3\r[h:0] 3/3 |###|\n" == labelled(b"[h:0] ", whole)


def test_a_line_ending_state_is_shown_without_its_final_cr(pipe):
    # print(state, end="\r"): the final \r may be the first half of a \r\n, so it still waits
    console = console_on(pipe)
    bar = RankStream(-1, pipe.w, rank=0)
    console.consume(bar, b"1/3\r")
    console.consume(bar, b"2/3\r")
    settled(console)
    assert pipe.read() == b"[h:0] 1/3\r[h:0] 2/3"
    console.consume(bar, b"\n")
    assert pipe.read() == b"\r\n"


def test_another_write_ends_the_shown_state_which_comes_back_after_it(pipe):
    console = console_on(pipe)
    bar = RankStream(-1, pipe.w, rank=0)
    other = RankStream(-1, pipe.w, rank=1)
    console.consume(bar, b"\r3/3")
    settled(console)
    assert pipe.read() == b"[h:0] \r[h:0] 3/3"
    console.consume(other, b"a line\n")
    assert pipe.read() == b"\r[h:1] a line\n"  # never on the bar's line
    settled(console)
    assert pipe.read() == b"[h:0] 3/3"  # the bar again, below it
    console.consume(bar, b"\rdone\n")
    assert pipe.read() == b"\r[h:0] done\n"


def test_plain_partial_lines_still_wait_for_their_newline(pipe):
    console = console_on(pipe)
    plain = RankStream(-1, pipe.w, rank=0)
    console.consume(plain, b"loading...")
    console.settle()
    assert console.wait() is None
    console.show_progress()
    assert pipe.read() == b""


def test_with_dedupe_the_state_waits_for_the_held_lines(pipe):
    console = console_on(pipe, merge_as="h")
    bar = RankStream(-1, pipe.w, rank=0)
    console.consume(bar, b"\r1/3\r2/3")
    console.settle()
    console.show_progress()
    assert pipe.read() == b""  # its earlier states are held for their window: order first
    console._merger.flush_all()  # their window passed
    console.show_progress()
    assert pipe.read() == b"[h:0] \r[h:0] 1/3\r[h:0] 2/3"
    console.consume(bar, b"\r3/3\n")  # a held update ends the shown state before it is written in full
    console.flush_held()
    assert pipe.read() == b"\r[h:0] 2/3\r[h:0] 3/3\n"


# ---------------------------------------------------------------------------------------------------------------
# On a terminal: `python -m xrun` on a pty, the rank working after its last update.

HAND_BAR = """
import os, sys, time
for step in range(4):
    sys.stdout.write(f"\\rprogress {step}/3"); sys.stdout.flush(); time.sleep(0.05)
time.sleep(float(os.environ["WORK_S"]))
open(os.environ["WOKE"], "w").close()
print()
"""

TQDM_BAR = """
import os, sys, time
from tqdm import tqdm
bar = tqdm(total=3, desc="progress", mininterval=0, file=sys.stdout)
for _ in range(3):
    time.sleep(0.05); bar.update(1)
time.sleep(float(os.environ["WORK_S"]))
open(os.environ["WOKE"], "w").close()
bar.close()
"""


def read_terminal_until(master: int, proc: subprocess.Popen, marker: bytes, timeout: float) -> bytes:
    """What the terminal got until ``marker`` appeared (or the rank ended, or ``timeout``)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.05)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not data:
            break
        seen += data
    return seen


@pytest.mark.parametrize("script", ["hand", "tqdm"])
def test_the_terminal_shows_the_last_state_while_the_rank_works(tmp_path, script):
    if script == "tqdm":
        pytest.importorskip("tqdm")
    path = tmp_path / "bar.py"
    path.write_text(HAND_BAR if script == "hand" else TQDM_BAR)
    woke = tmp_path / "woke"
    env = {**os.environ, "PYTHONPATH": ROOT, "WORK_S": "5", "WOKE": str(woke)}
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "xrun", "--log_dir", str(tmp_path / "logs"), str(path)],
                            stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    try:
        seen = read_terminal_until(master, proc, b"3/3", timeout=20)
        assert b"3/3" in seen, seen
        assert not woke.exists(), "3/3 reached the terminal only after the rank's work"  # the rank sleeps 5 s
        last = seen.rsplit(b"\r", 1)[-1]
        assert last.startswith(b"[localhost:0] ") and b"3/3" in last  # the line shows it now, prefixed
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    raw = (tmp_path / "logs" / "localhost" / "rank0" / "stdout.log").read_bytes()
    assert raw.startswith(b"\r") and b"[localhost" not in raw  # the log file keeps the rank's own bytes
