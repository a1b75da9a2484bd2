"""The output path's throughput mechanics (issue 15): big pipe buffers, big reads, and a short settle after a
trickle so a line-by-line rank is read once per millisecond, not once per line. Benchmarks measure the speed
(``python -m bench logging``); these tests check the mechanics and that nothing is lost or split.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

from xrun.common.output import streams as output
from xrun.common.output.streams import CHUNK, PIPE_BYTES, Console, RankStream, grow_pipe

_F_GETPIPE_SZ = 1032


def test_grow_pipe_gives_a_rank_pipe_a_megabyte():
    r, w = os.pipe()
    try:
        grow_pipe(r)
        assert fcntl.fcntl(r, _F_GETPIPE_SZ) == PIPE_BYTES
    finally:
        os.close(r)
        os.close(w)


def test_grow_pipe_on_something_else_is_harmless(tmp_path):
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    try:
        grow_pipe(fd)  # EBADF-like refusal: the default buffer does
    finally:
        os.close(fd)


def _console_with_pipe(monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr(output.time, "sleep", sleeps.append)
    r, w = os.pipe()
    os.set_blocking(r, False)
    out_r, out_w = os.pipe()
    console = Console(prefix=True, quiet=False, host="h")
    stream = RankStream(r, out_w, rank=0)
    console._ok[out_w] = True  # the test's own console fd
    return console, stream, w, out_r, sleeps


def test_settle_sleeps_only_after_a_trickle(monkeypatch):
    console, stream, w, out_r, sleeps = _console_with_pipe(monkeypatch)
    console.settle()
    assert sleeps == []  # nothing was read
    os.write(w, b"one line\n")
    assert console.read(stream)
    console.settle()
    assert sleeps == [output.SETTLE_S]
    console.settle()
    assert sleeps == [output.SETTLE_S]  # once per trickle
    assert os.read(out_r, 100) == b"[h:0] one line\n"


def test_a_flooding_rank_is_read_again_at_once(monkeypatch):
    console, stream, w, _, sleeps = _console_with_pipe(monkeypatch)
    grow_pipe(stream.fd)
    stream.console = os.open(os.devnull, os.O_WRONLY)  # a megabyte of echo must not fill the test's pipe
    console._ok[stream.console] = True
    line = b"x" * 127 + b"\n"
    os.write(w, line * (CHUNK // 128))  # exactly one chunk: fits the grown pipe
    assert console.read(stream)  # a full chunk: the rank floods
    assert not console.read(stream)  # nothing more for now
    console.settle()
    assert sleeps == []


def test_a_line_by_line_rank_arrives_whole_and_in_order(tmp_path):
    """20,000 lines written one write each (python -u) through a real agent: every line once, whole, in order."""
    script = tmp_path / "w.py"
    script.write_text("import sys\nfor i in range(20000):\n    sys.stdout.write(f'{i:08d} ' + 'y' * 80 + '\\n')\n")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    done = subprocess.run([sys.executable, "-m", "xrun", "--log_dir", str(tmp_path / "logs"), str(script)],
                          capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [f"[localhost:0] {i:08d} ".encode() + b"y" * 80 for i in range(20000)]
    logged = (tmp_path / "logs" / "localhost" / "rank0" / "stdout.log").read_bytes()
    assert logged == b"".join(f"{i:08d} ".encode() + b"y" * 80 + b"\n" for i in range(20000))
