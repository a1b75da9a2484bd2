"""De-duplication (issue 17): the pure merge logic as tables, the never-reorder property with hypothesis, and
8 real ranks through the real CLI (shared and own lines on stdout and stderr, log files raw, a failing rank's
own tail in the report).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tests.headserver import endpoint_of, head_server
from tests.labels import expand
from xrun.common.output.dedupe import WINDOW_S, LineMerger, compact
from xrun.common.output.render import label
from xrun.common.output.streams import split_lines
from xrun.common.output.writer import writer


class Out:
    """What the merger wrote, as (fd, line) pairs, each line with its label."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, bytes]] = []

    def __call__(self, fd: int, merged) -> None:
        self.writes.extend((fd, label(hosts, ranks) + text) for hosts, ranks, text in merged)


def play(events, *, window=1.0, max_held=1000, flush_at=None, expected=None, late_window=1.0):
    """events: (time, rank, text) or (time, rank, text, fd, mergeable); every rank on host h, fd 1 by default."""
    out = Out()
    merger = LineMerger(out, window=window, max_held=max_held, expected=expected, late_window=late_window)
    for event in events:
        now, rank, text = event[:3]
        fd = event[3] if len(event) > 3 else 1
        mergeable = event[4] if len(event) > 4 else True
        merger.flush(now)
        merger.add((rank, fd), fd, text, "h", (rank,), now, mergeable=mergeable)
    if flush_at is None:
        merger.flush_all()
    else:
        merger.flush(flush_at)
    return [line for _, line in out.writes]


@pytest.mark.parametrize(
    "events, shown",
    [
        # one rank's line waits its window and is written with its own prefix
        ([(0, 3, b"x\n")], [b"[h:3] x\n"]),
        # the same line from 4 ranks within the window: once, with the compact rank set
        ([(0, 0, b"w\n"), (0.1, 2, b"w\n"), (0.2, 1, b"w\n"), (0.3, 5, b"w\n")], [b"[h:0-2,5] w\n"]),
        # after the window a twin opens its own group
        ([(0, 0, b"w\n"), (1.5, 1, b"w\n")], [b"[h:0] w\n", b"[h:1] w\n"]),
        # different lines stay apart, in arrival order
        ([(0, 0, b"a\n"), (0, 1, b"b\n")], [b"[h:0] a\n", b"[h:1] b\n"]),
        # a rank repeating itself is never merged with itself
        ([(0, 0, b"a\n"), (0, 0, b"a\n")], [b"[h:0] a\n", b"[h:0] a\n"]),
        # shared, own, shared: the second shared line moves after every own line
        ([(0, 0, b"A\n"), (0, 0, b"own 0\n"), (0, 0, b"B\n"), (0, 1, b"A\n"), (0, 1, b"own 1\n"), (0, 1, b"B\n")],
         [b"[h:0-1] A\n", b"[h:0] own 0\n", b"[h:1] own 1\n", b"[h:0-1] B\n"]),
        # crossed order (rank 0: A, B; rank 1: B, A): rank 1's A cannot join rank 0's A, which must stay before
        # rank 0's B, now also rank 1's: it is written on its own, after
        ([(0, 0, b"A\n"), (0, 0, b"B\n"), (0, 1, b"B\n"), (0, 1, b"A\n")],
         [b"[h:0] A\n", b"[h:0-1] B\n", b"[h:1] A\n"]),
        # a \r progress update is never merged
        ([(0, 0, b"42%\r", 2, False), (0, 1, b"42%\r", 2, False)], [b"[h:0] 42%\r", b"[h:1] 42%\r"]),
        # stdout and stderr are separate consoles: the same text on each is not one line
        ([(0, 0, b"x\n", 1), (0, 1, b"x\n", 2)], [b"[h:0] x\n", b"[h:1] x\n"]),
    ],
)
def test_merge_table(events, shown):
    assert play(events) == shown


def test_a_line_is_written_once_its_window_passed_not_before():
    assert play([(0, 0, b"a\n")], window=0.2, flush_at=0.1) == []
    assert play([(0, 0, b"a\n")], window=0.2, flush_at=0.2) == [b"[h:0] a\n"]


# With the number of ranks the console shows (``expected``): lines all ranks said go at once, shared lines wait
# for the rest of the ranks, and late ranks' copies gather in one more line.
@pytest.mark.parametrize(
    "expected, events, flush_at, shown",
    [
        # every rank said it: written when the last one did, not a window later
        (3, [(0, 0, b"w\n"), (0.05, 1, b"w\n"), (0.1, 2, b"w\n")], 0.1, [b"[h:0-2] w\n"]),
        # ... but not before the groups ahead of it
        (4, [(0, 3, b"own\n"), (0.05, 0, b"w\n"), (0.06, 1, b"w\n"), (0.07, 2, b"w\n"), (0.08, 3, b"w\n")], 0.1,
         []),
        # a line only one rank said waits one window
        (4, [(0, 0, b"own\n")], 0.2, [b"[h:0] own\n"]),
        # a line two of four said waits for the rest up to the late window (1 s) from its first copy ...
        (4, [(0, 0, b"w\n"), (0.1, 1, b"w\n")], 0.9, []),
        (4, [(0, 0, b"w\n"), (0.1, 1, b"w\n")], 1.0, [b"[h:0-1] w\n"]),
        # ... and goes as soon as the last rank said it
        (4, [(0, 0, b"w\n"), (0.1, 1, b"w\n"), (0.6, 2, b"w\n"), (0.9, 3, b"w\n")], 0.9, [b"[h:0-3] w\n"]),
        # later than that, the late ranks' copies gather in a group of their own, which waits for every late rank
        (4, [(0, 0, b"w\n"), (0.1, 1, b"w\n"), (1.5, 2, b"w\n"), (2.2, 3, b"w\n")], 2.2,
         [b"[h:0-1] w\n", b"[h:2-3] w\n"]),
        (4, [(0, 0, b"w\n"), (0.1, 1, b"w\n"), (1.5, 2, b"w\n")], 2.4, [b"[h:0-1] w\n"]),
        (4, [(0, 0, b"w\n"), (0.1, 1, b"w\n"), (1.5, 2, b"w\n")], 2.5, [b"[h:0-1] w\n", b"[h:2] w\n"]),
        # once every rank said it, the same line again is a new one: a single copy waits one window
        (4, [(0, 0, b"w\n"), (0, 1, b"w\n"), (0, 2, b"w\n"), (0, 3, b"w\n"), (0.5, 0, b"w\n")], 0.7,
         [b"[h:0-3] w\n", b"[h:0] w\n"]),
        # a late copy long after (past RECALL_S) is a new line too
        (4, [(0, 0, b"w\n"), (0.1, 1, b"w\n"), (9.0, 2, b"w\n")], 9.2, [b"[h:0-1] w\n", b"[h:2] w\n"]),
    ],
)
def test_merge_table_knowing_the_ranks(expected, events, flush_at, shown):
    assert play(events, window=0.2, expected=expected, flush_at=flush_at) == shown


def test_held_lines_are_bounded():
    events = [(0, 0, f"{i}\n".encode()) for i in range(10)]
    assert play(events, max_held=3, flush_at=0) == [f"[h:0] {i}\n".encode() for i in range(7)]


def test_labels_across_hosts_and_compact_ranges():
    assert label(["a"], [3, 1, 2]) == b"[a:1-3] "
    assert label(["a", "b"], [0, 1, 2, 3, 5]) == b"[ranks 0-3,5] "
    assert compact([7, 0, 1, 2, 4, 5, 9, 2]) == "0-2,4-5,7,9"
    assert expand("0-2,4-5,7,9") == [0, 1, 2, 4, 5, 7, 9]
    assert expand("3") == [3] and expand("a") is None and expand("3-1") is None and expand("1-") is None


@pytest.mark.parametrize(
    "pending, chunk, lines, rest",
    [
        (b"", b"a\nb", [b"a\n"], b"b"),
        (b"pa", b"rt\n", [b"part\n"], b""),
        (b"", b"10%\r20%\r", [b"10%\r"], b"20%\r"),  # a final \r may be the start of \r\n
        (b"20%\r", b"\nnext\n", [b"20%\r\n", b"next\n"], b""),
        (b"", b"\xff\xfe\n", [b"\xff\xfe\n"], b""),
        (b"", b"no end", [], b"no end"),
    ],
)
def test_split_lines(pending, chunk, lines, rest):
    assert split_lines(pending, chunk) == (lines, rest)


# Hypothesis: whatever the interleaving, times and texts, each rank's lines come out complete, each once, and
# in the order it wrote them; every line's label names exactly the ranks that said it there.
_line = st.sampled_from([b"same\n", b"warn\n", b"x\n", b"y\n", b"bar\r"])
_event = st.tuples(st.floats(0, 0.5), st.integers(0, 3), _line)


@settings(max_examples=300, deadline=None)
@given(st.lists(_event, max_size=40), st.integers(1, 50), st.sampled_from([None, 4]),
       st.lists(st.floats(0, 3), max_size=5))
def test_a_ranks_lines_are_never_reordered_lost_or_repeated(events, max_held, expected, flushes):
    """With or without the rank count (early, late and stragglers' groups), and flushes at any time."""
    events = sorted(events + [(t, None, None) for t in flushes], key=lambda e: e[0])  # time goes forward
    out = Out()
    merger = LineMerger(out, window=0.1, max_held=max_held, expected=expected, late_window=0.3)
    for now, rank, text in events:
        merger.flush(now)
        if rank is not None:
            merger.add((rank, 1), 1, text, "h", (rank,), now, mergeable=not text.endswith(b"\r"))
    merger.flush_all()
    seen: dict[int, list[bytes]] = {}
    for _, line in out.writes:
        match = re.match(rb"\[h:([0-9,-]+)\] ", line)
        assert match, line
        for rank in expand(match.group(1).decode()):
            seen.setdefault(rank, []).append(line[match.end():])
    wrote: dict[int, list[bytes]] = {}
    for _, rank, text in events:
        if rank is not None:
            wrote.setdefault(rank, []).append(text)
    assert seen == wrote


@settings(max_examples=200, deadline=None)
@given(st.lists(_event, min_size=1, max_size=30))
def test_no_line_waits_more_than_the_late_window_and_one_window(events):
    """The bound README states: each line is written at most late_window + window after its rank said it."""
    events.sort(key=lambda e: e[0])
    clock = [0.0]
    waits: list[float] = []
    pending: dict[int, list[float]] = {}  # rank -> when its lines came, oldest first (a rank's order is kept)

    def emit(fd, merged):
        for _, ranks, _ in merged:
            waits.extend(clock[0] - pending[rank].pop(0) for rank in ranks)

    merger = LineMerger(emit, window=0.1, expected=4, late_window=0.3)

    def run_until(at):
        while (due := merger.next_deadline()) is not None and due <= at:  # the loop wakes at every deadline
            clock[0] = max(clock[0], due)
            merger.flush(clock[0])

    for at, rank, text in events:
        run_until(at)
        clock[0] = at
        merger.add((rank, 1), 1, text, "h", (rank,), at, mergeable=not text.endswith(b"\r"))
        pending.setdefault(rank, []).append(at)
        merger.flush(at)
    run_until(float("inf"))
    assert len(waits) == len(events) and max(waits) <= 2 * 0.3 + 1e-9


def test_no_line_waits_more_than_two_windows():
    out = Out()
    merger = LineMerger(out, window=0.1)
    merger.add(0, 1, b"A\n", "h", (0,), 0.0)
    merger.add(1, 1, b"own1\n", "h", (1,), 0.09)
    merger.add(1, 1, b"A\n", "h", (1,), 0.095)  # A moves after own1, keeping its deadline (0.1)
    merger.flush(0.15)
    assert out.writes == []  # A waits for own1, before it now
    merger.flush(0.19)  # own1's window: both out, A 0.19 s after rank 0 said it (< 2 windows)
    assert [line for _, line in out.writes] == [b"[h:1] own1\n", b"[h:0-1] A\n"]
    assert WINDOW_S <= 0.2


# ---------------------------------------------------------------------------------------------------------------
# Real ranks through the CLI.

CHATTY = """
import os, sys, time
r = int(os.environ["RANK"])
print("UserWarning: the shared warning", flush=True)
print(f"own line of rank {r}", flush=True)
print("shared on stderr", file=sys.stderr, flush=True)
print(f"own stderr of rank {r}", file=sys.stderr, flush=True)
print("the shared end", flush=True)
if r == int(os.environ.get("FAIL_RANK", "-1")):
    print(f"rank {r} own error", file=sys.stderr, flush=True)
    sys.exit(3)
"""


def _xrun(tmp_path, *flags, env=None):
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    full = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", **(env or {})}
    full.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [sys.executable, "-m", "xrun", "--num_gpus", "8", "--log_dir", str(tmp_path / "logs"), *flags, str(script)]
    return subprocess.run(argv, capture_output=True, env=full, timeout=120, cwd=str(tmp_path))


def _lines(data: bytes) -> list[bytes]:
    return [line for line in data.splitlines() if not line.startswith(b"xrun")]


def test_eight_ranks_shared_lines_once_own_lines_eight_times_logs_raw(tmp_path):
    done = _xrun(tmp_path)
    assert done.returncode == 0, done.stderr
    out, err = _lines(done.stdout), _lines(done.stderr)
    for text, lines in ((b"UserWarning: the shared warning", out), (b"the shared end", out),
                        (b"shared on stderr", err)):
        shown = [line for line in lines if line.endswith(b"] " + text)]
        ranks = [r for line in shown for r in expand(line[line.index(b":") + 1:line.index(b"]")].decode())]
        assert sorted(ranks) == list(range(8)), shown  # every rank said it, each named once
        assert len(shown) <= 3, shown  # once, or in a few groups when ranks start far apart on a loaded machine
    for r in range(8):
        assert out.count(f"[localhost:{r}] own line of rank {r}".encode()) == 1
        assert err.count(f"[localhost:{r}] own stderr of rank {r}".encode()) == 1
        mine = [line for line in out if line.startswith(b"[localhost:") and (
            r in expand(line[11:line.index(b"]")].decode()))]
        assert [m.split(b"] ", 1)[1] for m in mine] == [
            b"UserWarning: the shared warning", f"own line of rank {r}".encode(), b"the shared end"]
        logs = tmp_path / "logs" / "localhost" / f"rank{r}"
        assert (logs / "stdout.log").read_bytes() == (
            f"UserWarning: the shared warning\nown line of rank {r}\nthe shared end\n".encode())
        assert (logs / "stderr.log").read_bytes() == f"shared on stderr\nown stderr of rank {r}\n".encode()


def test_no_dedupe_prints_every_ranks_line(tmp_path):
    done = _xrun(tmp_path, "--no_dedupe")
    assert done.returncode == 0, done.stderr
    out = _lines(done.stdout)
    assert sorted(out.count(f"[localhost:{r}] the shared end".encode()) for r in range(8)) == [1] * 8


def test_a_failing_rank_among_chatty_ranks_has_its_own_complete_tail(tmp_path):
    done = _xrun(tmp_path, env={"FAIL_RANK": "5"})
    assert done.returncode == 3
    report = done.stderr.decode()
    # "first" when some other rank was still running and was stopped, else the lone failure
    assert re.search(r"rank 5 failed( first)?: exit code 3", report), report
    tail = report[report.index("of rank 5's stderr:"):].splitlines()[1:]
    assert [line.strip() for line in tail[:3]] == ["| shared on stderr", "| own stderr of rank 5", "| rank 5 own error"]
    assert b"[localhost:5] rank 5 own error" in done.stderr


def test_a_flooding_chunk_is_written_as_it_comes_after_what_is_held():
    from xrun.common.output.dedupe import FLOOD_LINES
    from xrun.common.output.streams import Console, RankStream

    r, w = os.pipe()
    try:
        console = Console(prefix=True, quiet=False, merge_as="h")
        console._ok[w] = True
        quiet = RankStream(-1, w, rank=0)
        flood = RankStream(-1, w, rank=1)
        console.consume(quiet, b"held warning\n")
        assert console.wait() is not None  # held for its twins
        console.consume(flood, b"".join(b"line %d\n" % i for i in range(FLOOD_LINES + 1)))
        assert console.wait() is None  # the flood pushed the held line out first, then went out whole
        writer().drain()  # the console is written from a thread (issue 25 §3)
        out = os.read(r, 1 << 16).splitlines()
        assert out[0] == b"[h:0] held warning" and out[1] == b"[h:1] line 0" and len(out) == FLOOD_LINES + 2
    finally:
        os.close(r)
        os.close(w)


def test_held_bytes_are_bounded(monkeypatch):
    from xrun.common.output import dedupe
    monkeypatch.setattr(dedupe, "MAX_HELD_BYTES", 10)
    assert play([(0, 0, b"abcdef\n"), (0, 0, b"ghijkl\n")], flush_at=0) == [b"[h:0] abcdef\n"]


# ---------------------------------------------------------------------------------------------------------------
# The head's merge in the control server's loop: agents of 3 "nodes" on this machine, their lines over the control
# channel into the server's console, their own stdout relayed as the ssh backend relays an exec channel's
# (xrun.runner.backends.ssh.SshSessions: StreamLines onto the same console).

SHARED_AND_OWN = """
import os
print("the same on every node", flush=True)
print("own", os.environ["RANK"], flush=True)
"""


class RelayedSessions:
    def __init__(self, plan, endpoint):
        from xrun.runner.backends.channel import agent_connect_argv

        self.procs = {}
        self.streams = {}
        for node in plan.nodes:
            argv = agent_connect_argv(sys.executable, endpoint, str(node.node_rank), token_on_stdin=True)
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
                                    env={**os.environ, "PYTHONPATH": ROOT})
            proc.stdin.write(endpoint.token.encode() + b"\n")
            proc.stdin.close()
            self.procs[node.host] = proc

    def register(self, loop):
        from xrun.runner.job.relay import StreamLines

        for host, proc in self.procs.items():
            self.streams[host] = StreamLines(loop.console, ("agent", host), 1)
            loop.add_reader(proc.stdout, lambda h=host, p=proc: self._read(loop, h, p))

    def _read(self, loop, host, proc):
        data = os.read(proc.stdout.fileno(), 65536)
        if data:
            self.streams[host].feed(data)
        else:
            self.streams[host].flush()
            loop.remove_reader(proc.stdout)

    def finished(self, lost):
        return all(p.poll() is not None for p in self.procs.values())

    def terminate(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
            proc.wait()


def test_the_head_merges_the_same_line_of_every_node(tmp_path, capfd):
    from xrun.common.output.render import JobConsole
    from xrun.common.output.status import PlainStatus
    from xrun.common.procs.posix import write_all
    from xrun.common.rankplan import LaunchOptions
    from xrun.runner.plan import JobRequest, make_plan

    script = tmp_path / "rank.py"
    script.write_text(SHARED_AND_OWN)
    request = JobRequest(script=str(script), master_port=0, launch=LaunchOptions(python=sys.executable),
                         cwd=str(tmp_path))
    plan = make_plan(request, {"a": (0, 1), "b": (0,), "c": (0,)}, "ssh")
    server = head_server(plan, join_timeout=30.0, status=PlainStatus(3))
    port = server.listen(["127.0.0.1"])
    # generous: agents start ~0.1-0.5 s apart on a loaded machine
    server.console = JobConsole(write_all, merge=True, window=1.0)
    assert server.run(RelayedSessions(plan, endpoint_of(server, port))) == 0
    out = [line for line in capfd.readouterr().out.splitlines() if not line.startswith("xrun")]
    assert out.count("[ranks 0-3] the same on every node") == 1, out
    assert sorted(line for line in out if " own " in line) == ["[a:0] own 0", "[a:1] own 1", "[b:2] own 2",
                                                               "[c:3] own 3"]
