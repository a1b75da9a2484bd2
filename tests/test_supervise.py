"""The rank supervisor, measured with real processes (tests/procs/rank.py) and a real agent process
(tests/procs/run_group.py) where the agent itself must be signalled or killed.

Every rank carries a unique XRUN_TEST_MARK in its environment; "nothing survived" is checked by scanning
/proc/*/environ for it. Zombies count as gone (PID 1 here reaps orphans only every ~2 s).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.cluster.harness import processes_with_marker
from xrun.common.output.render import labelled
from xrun.common.output.streams import cut_lines
from xrun.common.result.failure_report import format_failure_report
from xrun.common.result.outcome import NodeResult, RankOutcome
from xrun.launch.procs import proctable
from xrun.launch.ranks.processes import RankProcess
from xrun.launch.ranks.supervise import RankGroup, SuperviseOptions

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_PY = os.path.join(HERE, "procs", "rank.py")
DRIVER = os.path.join(HERE, "procs", "run_group.py")
WAIT = 30.0  # generous: the machine may be loaded; nothing asserts on wall time


# ---------------------------------------------------------------------------------------------------------------
# Helpers.


def marked(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment carries the marker."""
    return processes_with_marker(f"XRUN_TEST_MARK={marker}")


def wait_for(predicate, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def marker():
    mark = f"xrun-test-{uuid.uuid4().hex}"
    yield mark
    for pid in marked(mark):  # never leave anything behind, even when a test failed
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def ready(tmp_path):
    path = tmp_path / "ready"
    path.mkdir()
    return str(path)


def steps_argv(*steps: str) -> tuple[str, ...]:
    return (sys.executable, RANK_PY, *steps)


def rank(n: int, *steps: str, marker: str, cpus=None, argv=None) -> RankProcess:
    return RankProcess(
        rank=n,
        local_rank=n,
        argv=argv or steps_argv(*steps),
        env={**os.environ, "XRUN_TEST_MARK": marker},
        cpus=cpus,
    )


def run_group(procs, **options) -> NodeResult:
    options.setdefault("host", "h")
    return RankGroup(procs, SuperviseOptions(**options)).run()


def hx(data: bytes) -> str:
    return data.hex()


class Agent:
    """A real agent process (tests/procs/run_group.py) running ranks given as step lists."""

    def __init__(self, tmp_path, marker: str, ranks: list[list[str]], wrapper: tuple[str, ...] = (),
                 preload: dict | None = None, **options) -> None:
        options.setdefault("host", "h")
        self.result_path = tmp_path / "result.json"
        self.out_path = tmp_path / "agent.out"
        self.err_path = tmp_path / "agent.err"
        spec = {
            "options": options,
            "result": str(self.result_path),
            "preload": preload,
            "procs": [
                {"rank": i, "argv": list(steps_argv(*steps)), "env": {**os.environ, "XRUN_TEST_MARK": marker}}
                for i, steps in enumerate(ranks)
            ],
        }
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(spec))
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            argv = [*wrapper, sys.executable, DRIVER, str(spec_path)]
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err)

    def wait(self, timeout: float = WAIT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"agent still running after {timeout} s; stderr:\n{self.stderr()}") from None

    def result(self) -> dict:
        return json.loads(self.result_path.read_text())

    def stdout(self) -> bytes:
        return self.out_path.read_bytes()

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")


def n_ready(directory: str, n: int) -> bool:
    return len(os.listdir(directory)) >= n


def ready_pids(directory: str, role: str) -> list[int]:
    return [int(name.split(".")[0]) for name in os.listdir(directory) if name.endswith("." + role)]


# ---------------------------------------------------------------------------------------------------------------
# Pure: line framing.


@pytest.mark.parametrize(
    "pending, chunk, out, rest",
    [
        (b"", b"a\n", b"[p] a\n", b""),
        (b"", b"a\nb\nc", b"[p] a\n[p] b\n", b"c"),
        (b"par", b"tial\n", b"[p] partial\n", b""),
        (b"x", b"yz", b"", b"xyz"),
        (b"", b"\n\n", b"[p] \n[p] \n", b""),
        (b"", b"\xff\xfe\n\x00\x80", b"[p] \xff\xfe\n", b"\x00\x80"),
        (b"", b"a\r\nb\n", b"[p] a\r\n[p] b\n", b""),
        (b"", b"", b"", b""),
    ],
)
def test_lines_are_cut_and_labelled_complete_lines_only(pending, chunk, out, rest):
    done, left = cut_lines(pending, chunk)  # the node cuts its ranks' lines; the head labels them
    assert (labelled(b"[p] ", done), left) == (out, rest)


# ---------------------------------------------------------------------------------------------------------------
# Exits and teardown.


def test_all_ranks_exit_zero_outcomes_in_rank_order(marker, capfd):
    seen: list[RankOutcome] = []
    procs = [rank(n, "exit", "0", marker=marker) for n in (2, 0, 1)]
    result = RankGroup(procs, SuperviseOptions(host="h"), on_rank_exit=seen.append).run()
    assert result.exit_code == 0
    assert result.root_cause is None and result.interrupted_by is None
    assert [o.rank for o in result.outcomes] == [0, 1, 2]
    assert all(o.returncode == 0 and o.signal is None and not o.failed and o.pid > 0 for o in result.outcomes)
    assert all(not o.stopped_by_xrun and o.leftovers == () for o in result.outcomes)
    assert sorted(o.rank for o in seen) == [0, 1, 2]
    assert marked(marker) == []


def test_children_are_listed_by_the_kernel_until_reaped():
    child = subprocess.Popen(["sleep", "30"])
    try:
        kids = proctable.children()
        assert kids is not None and child.pid in kids  # this kernel keeps the list (else the scan always runs)
    finally:
        child.kill()
        child.wait()
    assert child.pid not in (proctable.children() or set())


def test_a_clean_end_skips_the_scan_of_every_process(marker, capfd, monkeypatch):
    """Nothing but the watchdog is left as our child: no session member can be alive, so /proc is not read; a
    leaked child (test_leaked_child_after_success_...) is still found by the scan."""
    scans = []
    real = proctable.session_members
    monkeypatch.setattr(proctable, "session_members", lambda sids: scans.append(sids) or real(sids))
    procs = [rank(n, "exit", "0", marker=marker) for n in (0, 1)]
    assert RankGroup(procs, SuperviseOptions(host="h")).run().exit_code == 0
    assert scans == []


def test_a_rank_exiting_zero_does_not_stop_the_others(marker, ready, capfd):
    procs = [
        rank(0, "ready", ready, "exit", "0", marker=marker),
        rank(1, "wait-ready", f"1@{ready}", "sleep", "0.2", "exit", "0", marker=marker),
    ]
    result = run_group(procs)
    assert result.exit_code == 0
    assert [o.stopped_by_xrun for o in result.outcomes] == [False, False]


def test_first_failure_stops_the_rest_and_its_code_propagates(marker, ready, capfd):
    procs = [
        rank(0, "ready", ready, "sleep", "60", marker=marker),
        rank(1, "ready", ready, "sleep", "60", marker=marker),
        rank(2, "wait-ready", f"2@{ready}", "err", hx(b"it broke\n"), "exit", "7", marker=marker),
    ]
    result = run_group(procs)
    assert result.exit_code == 7
    assert result.root_cause is not None and result.root_cause.rank == 2
    assert result.root_cause.returncode == 7 and not result.root_cause.stopped_by_xrun
    assert result.root_cause.stderr_tail == ("it broke",)
    for outcome in result.outcomes[:2]:
        assert outcome.signal == signal.SIGTERM and outcome.stopped_by_xrun and outcome.failed
    assert marked(marker) == []
    assert "stopping 2 ranks" in capfd.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGKILL])
def test_death_by_signal_gives_128_plus_signal_and_names_it(marker, ready, capfd, signum):
    procs = [
        rank(0, "ready", ready, "sleep", "60", marker=marker),
        rank(1, "wait-ready", f"1@{ready}", "raise", str(int(signum)), marker=marker),
    ]
    result = run_group(procs)
    assert result.exit_code == 128 + signum
    assert result.root_cause is not None and result.root_cause.rank == 1
    assert result.root_cause.signal == signum and result.root_cause.returncode is None
    report = format_failure_report(result)
    assert signal.Signals(signum).name in report
    assert "root cause" in report
    assert marked(marker) == []


@pytest.mark.slow
def test_rank_ignoring_sigterm_is_killed_at_the_deadline(marker, ready, capfd):
    procs = [
        rank(0, "ignore-term", "-", "ready", ready, "sleep", "60", marker=marker),
        rank(1, "wait-ready", f"1@{ready}", "exit", "3", marker=marker),
    ]
    result = run_group(procs, shutdown_timeout=0.5)
    assert result.exit_code == 3
    stubborn = result.outcomes[0]
    assert stubborn.signal == signal.SIGKILL and stubborn.stopped_by_xrun
    assert marked(marker) == []


@pytest.mark.slow
def test_grandchild_ignoring_sigterm_is_cleaned_up_and_reported(marker, ready, capfd):
    # rank 0 forks a child that ignores SIGTERM, waits until it is up, then fails.
    procs = [
        rank(0, "fork", "ignore", "ready", ready, "then", "-", "wait-ready", f"1@{ready}", "exit", "3", marker=marker)
    ]
    result = run_group(procs, shutdown_timeout=0.5)
    (child,) = ready_pids(ready, "child")
    assert result.exit_code == 3
    assert result.outcomes[0].leftovers == (child,)
    assert marked(marker) == []
    assert proctable.read_proc(child) is None  # reaped here (we are its subreaper), not left as a zombie


def test_leaked_child_after_success_does_not_hang_and_is_reported(marker, ready, capfd):
    # A DataLoader-worker-like child that outlives its rank (which exits 0), honouring SIGTERM.
    procs = [
        rank(0, "fork", "term", "ready", ready, "then", "-", "wait-ready", f"1@{ready}", "exit", "0", marker=marker),
        rank(1, "exit", "0", marker=marker),
    ]
    result = run_group(procs, shutdown_timeout=60)  # must not wait for the deadline: SIGTERM is enough
    (child,) = ready_pids(ready, "child")
    assert result.exit_code == 0
    assert result.outcomes[0].leftovers == (child,)
    assert result.outcomes[1].leftovers == ()
    assert marked(marker) == []
    assert "outlived their rank" in capfd.readouterr().err


def test_a_daemon_that_left_its_ranks_session_is_stopped_too(marker, ready, capfd):
    """A double fork and setsid takes a process out of its rank's session, not out of the job: the agent, their
    subreaper, inherits it and stops it with the other leftovers."""
    procs = [rank(0, "fork", "daemon", "ready", ready, "then", "-", "wait-ready", f"1@{ready}", "exit", "0",
                  marker=marker)]
    result = run_group(procs, shutdown_timeout=60)
    (daemon,) = ready_pids(ready, "child")
    assert result.exit_code == 0
    assert proctable.read_proc(daemon) is None  # stopped and reaped here, not left running nor a zombie
    assert marked(marker) == []
    assert "outlived their rank" in capfd.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ignore", "group"])
def test_leaked_child_ignoring_sigterm_is_killed_at_the_deadline(marker, ready, capfd, mode):
    # "group": the child also left its rank's process group (but not its session).
    procs = [rank(0, "fork", mode, "ready", ready, "then", "-", "wait-ready", f"1@{ready}", "exit", "0", marker=marker)]
    result = run_group(procs, shutdown_timeout=0.5)
    (child,) = ready_pids(ready, "child")
    assert result.exit_code == 0
    assert result.outcomes[0].leftovers == (child,)
    assert marked(marker) == []


def test_a_rank_that_cannot_start_is_the_root_cause(marker, ready, capfd):
    procs = [
        rank(0, "ready", ready, "sleep", "60", marker=marker),
        rank(1, marker=marker, argv=("/nonexistent/xrun-test-binary", "x")),
        rank(2, "sleep", "60", marker=marker),
    ]
    result = run_group(procs)
    assert result.exit_code == 127
    assert result.root_cause is not None and result.root_cause.rank == 1
    assert "nonexistent" in result.root_cause.stderr_tail[0]
    first, _, last = result.outcomes
    assert first.signal == signal.SIGTERM and first.stopped_by_xrun
    assert last.pid == 0 and last.stopped_by_xrun  # not started: the node was already stopping
    assert marked(marker) == []
    assert "not started" in format_failure_report(result)


def test_duplicate_ranks_are_refused(marker):
    with pytest.raises(ValueError, match="duplicate"):
        RankGroup([rank(0, marker=marker), rank(0, marker=marker)], SuperviseOptions(host="h"))


# ---------------------------------------------------------------------------------------------------------------
# Stopping from outside: signals to the agent, the control channel, kill -9.


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_agent_signal_stops_all_ranks_gracefully(tmp_path, marker, ready, signum):
    agent = Agent(tmp_path, marker, [["ready", ready, "sleep", "60"]] * 2)
    wait_for(lambda: n_ready(ready, 2), "ranks to start")
    agent.proc.send_signal(signum)
    assert agent.wait() == 128 + signum, agent.stderr()
    result = agent.result()
    assert result["interrupted_by"] == {"number": signum, "name": signal.Signals(signum).name}
    assert result["root_cause"] is None
    assert [r["signal"]["name"] for r in result["ranks"]] == ["SIGTERM", "SIGTERM"]
    assert all(r["stopped_by_xrun"] for r in result["ranks"])
    assert marked(marker) == []
    assert f"stopped by {signal.Signals(signum).name}" in agent.stderr()


def test_second_sigint_escalates_to_sigkill_at_once(tmp_path, marker, ready):
    agent = Agent(tmp_path, marker, [["ignore-term", "-", "ready", ready, "sleep", "120"]] * 2, shutdown_timeout=120)
    wait_for(lambda: n_ready(ready, 2), "ranks to start")
    agent.proc.send_signal(signal.SIGINT)
    # Two signals sent at once may merge into one (standard signals do not queue): wait for the first.
    wait_for(lambda: "stopping 2 ranks" in agent.stderr(), "the first SIGINT to be acted on")
    agent.proc.send_signal(signal.SIGINT)
    assert agent.wait(timeout=60) == 128 + signal.SIGINT  # well before the 120 s deadline
    assert [r["signal"]["name"] for r in agent.result()["ranks"]] == ["SIGKILL", "SIGKILL"]
    assert marked(marker) == []


@pytest.mark.slow
def test_agent_under_nohup_keeps_ignoring_sighup(tmp_path, marker, ready):
    agent = Agent(tmp_path, marker, [["ready", ready, "sleep", "60"]], wrapper=("nohup",))
    wait_for(lambda: n_ready(ready, 1), "rank to start")
    agent.proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)  # not a timing assertion: it must still be running however long we look
    assert agent.proc.poll() is None and marked(marker)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 128 + signal.SIGTERM


def kill_9_ranks(ready: str) -> list[list[str]]:
    """Three ranks and a grandchild (4 ready files) that only the watchdog's TERM and KILL stop."""
    return [
        ["ready", ready, "sleep", "120"],
        ["ignore-term", "-", "ready", ready, "sleep", "120"],  # needs the watchdog's SIGKILL
        ["fork", "ignore", "ready", ready, "then", "-", "ready", ready, "sleep", "120"],  # and a grandchild
    ]


@pytest.mark.slow
def test_kill_9_of_the_agent_leaves_no_rank_behind(tmp_path, marker, ready):
    agent = Agent(tmp_path, marker, kill_9_ranks(ready), shutdown_timeout=1)
    wait_for(lambda: n_ready(ready, 4), "ranks and the grandchild to start")
    assert len(marked(marker)) == 4
    agent.proc.kill()
    agent.proc.wait()
    wait_for(lambda: not marked(marker), "every rank and grandchild to die after the agent's SIGKILL")


def test_request_stop_from_an_added_reader(marker, ready, capfd):
    read_fd, write_fd = os.pipe()
    procs = [
        rank(0, "ready", ready, "sleep", "60", marker=marker),
        rank(1, "ready", ready, "sleep", "60", marker=marker),
    ]
    group = RankGroup(procs, SuperviseOptions(host="h"))

    def on_message() -> None:
        os.read(read_fd, 100)
        group.request_stop(signal.SIGTERM, reason="runner said stop")

    group.add_reader(read_fd, on_message)
    # The "runner" speaks once both ranks are up; a helper process stands in for it.
    helper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os,time\nwhile len(os.listdir({ready!r}))<2: time.sleep(0.005)\nos.write({write_fd}, b'stop')",
        ],
        pass_fds=(write_fd,),
    )
    try:
        result = group.run()
    finally:
        helper.wait()
        os.close(read_fd)
        os.close(write_fd)
    assert result.interrupted_by == signal.SIGTERM
    assert result.exit_code == 128 + signal.SIGTERM
    assert all(o.signal == signal.SIGTERM and o.stopped_by_xrun for o in result.outcomes)
    assert marked(marker) == []


def test_request_stop_before_run_starts_nothing(marker, capfd):
    group = RankGroup([rank(0, "sleep", "60", marker=marker)], SuperviseOptions(host="h"))
    group.request_stop(signal.SIGTERM)
    result = group.run()
    assert result.exit_code == 128 + signal.SIGTERM
    assert result.outcomes[0].pid == 0 and result.outcomes[0].stopped_by_xrun


def test_run_leaves_no_file_descriptor_behind_nor_closes_others_later(marker, ready, tmp_path, capfd):
    gc.collect()  # earlier tests' garbage (a socket in a cycle) must not close its fd during this run
    before = sorted(os.listdir("/proc/self/fd"))
    procs = [
        rank(0, "fork", "term", "ready", ready, "then", "-", "wait-ready", f"1@{ready}", "out", "78", marker=marker),
        rank(1, "wait-ready", f"1@{ready}", "err", hx(b"y"), "exit", "2", marker=marker),
    ]
    group = RankGroup(procs, SuperviseOptions(host="h", log_dir=str(tmp_path)))
    group.run()
    assert sorted(os.listdir("/proc/self/fd")) == before
    # New fds get the numbers the rank pipes had; freeing the group must not close them behind our back.
    mine = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]
    del group
    gc.collect()
    try:
        for fd in mine:
            os.fstat(fd)
    finally:
        for fd in mine:
            os.close(fd)


def test_run_restores_handlers_subreaper_and_releases_the_watchdog(marker, capfd):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)}
    subreaper_before = proctable.set_child_subreaper(False)
    group = RankGroup([rank(0, "exit", "0", marker=marker)], SuperviseOptions(host="h"))
    group.run()
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.set_wakeup_fd(-1) == -1
    assert proctable.set_child_subreaper(bool(subreaper_before)) is False
    assert group._watchdog is not None and proctable.read_proc(group._watchdog.pid) is None


# ---------------------------------------------------------------------------------------------------------------
# Output.


def test_prefixes_complete_lines_holds_partial_ones_and_passes_raw_bytes(marker, ready, capfdbinary):
    first = ("out", hx(b"hello\npart"), "sleep", "0.1", "out", hx(b"ial\n\xff\xfe raw\n"), "out", hx(b"no newline"))
    procs = [
        rank(0, *first, marker=marker),
        rank(1, "err", hx(b"to stderr\n"), marker=marker),
    ]
    result = run_group(procs)
    assert result.exit_code == 0
    out, err = capfdbinary.readouterr()
    assert out == b"[h:0] hello\n[h:0] partial\n[h:0] \xff\xfe raw\n[h:0] no newline\n"
    assert err == b"[h:1] to stderr\n"


def test_no_prefix_keeps_the_bytes_and_ends_the_last_line(marker, capfdbinary):
    result = run_group([rank(0, "out", hx(b"a\nb\xff"), "err", hx(b"e"), marker=marker)], prefix=False)
    assert result.exit_code == 0
    assert capfdbinary.readouterr() == (b"a\nb\xff\n", b"e\n")


def test_no_prefix_never_lets_two_ranks_share_a_line(marker, tmp_path, capfdbinary):
    # rank 0's line is half written when rank 1 writes a whole one (print() under python -u does this)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    procs = [
        rank(0, "out", hx(b"out"), "ready", str(first), "wait-ready", f"1@{second}", "out", hx(b" 0\n"), marker=marker),
        rank(1, "wait-ready", f"1@{first}", "sleep", "0.1", "out", hx(b"out 1\n"), "sleep", "0.1",
             "ready", str(second), marker=marker),
    ]
    result = run_group(procs, prefix=False)
    assert result.exit_code == 0
    out, _ = capfdbinary.readouterr()
    assert out == b"out 1\nout 0\n"


def test_quiet_writes_only_the_log_files(marker, tmp_path, capfdbinary):
    result = run_group(
        [rank(3, "out", hx(b"o\n"), "err", hx(b"e\n"), marker=marker)], quiet=True, log_dir=str(tmp_path)
    )
    assert result.exit_code == 0
    assert capfdbinary.readouterr() == (b"", b"")
    assert (tmp_path / "h" / "rank3" / "stdout.log").read_bytes() == b"o\n"
    assert (tmp_path / "h" / "rank3" / "stderr.log").read_bytes() == b"e\n"


def test_log_files_are_raw_and_earlier_runs_are_kept(marker, tmp_path, capfd):
    log_dir = str(tmp_path / "logs")
    run_group([rank(0, "out", hx(b"first\xff"), "err", hx(b"e1\n"), marker=marker)], log_dir=log_dir)
    directory = tmp_path / "logs" / "h" / "rank0"
    assert (directory / "stdout.log").read_bytes() == b"first\xff"  # raw: no prefix, no added newline
    stamp = time.mktime((2024, 3, 5, 6, 7, 8, 0, 0, -1))
    os.utime(directory / "stdout.log", (stamp, stamp))
    os.utime(directory / "stderr.log", (stamp, stamp))
    run_group([rank(0, "out", hx(b"second\n"), marker=marker)], log_dir=log_dir)
    assert (directory / "stdout.log").read_bytes() == b"second\n"
    assert (directory / "stdout.20240305-060708.log").read_bytes() == b"first\xff"
    assert (directory / "stderr.20240305-060708.log").read_bytes() == b"e1\n"
    assert (directory / "stderr.log").read_bytes() == b""


def test_a_link_in_place_of_a_log_file_is_never_followed(marker, tmp_path, capfd):
    # Another user's dangling link in a shared log directory: xrun (root here) must not create its target.
    directory = tmp_path / "logs" / "h" / "rank0"
    directory.mkdir(parents=True)
    victim = tmp_path / "victim"
    (directory / "stdout.log").symlink_to(victim)
    result = run_group([rank(0, "exit", "0", marker=marker)], log_dir=str(tmp_path / "logs"))
    assert not victim.exists()
    assert result.exit_code == result.outcomes[0].returncode == 126  # the rank did not start: the run fails
    assert f"xrun: cannot start rank 0: {directory / 'stdout.log'}: a symbolic link or another file is in the " \
        "way of this log file (xrun writes only files it creates); remove it or choose another --log_dir\n" \
        in capfd.readouterr().err  # one line
    assert os.path.islink(directory / "stdout.log")  # left as it was, for the user to look at


def test_log_files_are_created_new_and_through_no_foreign_link(tmp_path):
    from xrun.common.output.logfiles import LogFileRefused, open_logs

    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "logs").mkdir()
    link = tmp_path / "logs" / "h"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)  # another user's link (the tests run as root, who may give it away)
    with pytest.raises(LogFileRefused, match=r"/logs/h: a symbolic link of another user \(uid 65534\)"):
        open_logs(str(tmp_path / "logs"), "h", 0)
    assert list(victim.iterdir()) == []
    os.lchown(link, os.geteuid(), os.getegid())  # the user's own link: theirs to point anywhere
    for fd in open_logs(str(tmp_path / "logs"), "h", 0):
        os.close(fd)
    assert (victim / "rank0" / "stdout.log").is_file()
    (victim / "rank0" / "stderr.log").unlink()
    (victim / "rank0" / "stderr.log").symlink_to(tmp_path / "elsewhere")  # after stdout.log was rotated
    with pytest.raises(LogFileRefused, match="stderr.log: a symbolic link"):
        open_logs(str(tmp_path / "logs"), "h", 0)
    assert not (tmp_path / "elsewhere").exists()


def test_stderr_tail_keeps_the_last_twenty_lines(marker, capfd):
    result = run_group([rank(0, "lines", "30", "exit", "1", marker=marker)])
    assert result.outcomes[0].stderr_tail == tuple(f"line {i}" for i in range(10, 30))
    report = format_failure_report(result)
    assert "| line 29" in report and "| line 9\n" not in report


def test_stderr_tail_shows_what_a_terminal_would(marker, capfd):
    # A progress bar rewrites its line with "\r"; a runaway line is cut.
    data = b"10%\r50%\r100%\ndone\r\n" + b"y" * 5000 + b"\n"
    result = run_group([rank(0, "err", hx(data), "exit", "1", marker=marker)])
    first, second, third = result.outcomes[0].stderr_tail
    assert (first, second) == ("100%", "done")
    assert len(third) == 1000 and third.endswith("...")


def test_big_output_on_both_pipes_does_not_deadlock(marker, tmp_path, capfd):
    # 2 MB on stderr before anything on stdout: a reader that only drained one pipe would block forever.
    script = "import os\nos.write(2, b'e' * 2_000_000 + b'\\n')\nos.write(1, b'o' * 2_000_000 + b'\\n')\n"
    proc = rank(0, marker=marker, argv=(sys.executable, "-c", script))
    result = run_group([proc], quiet=True, log_dir=str(tmp_path))
    assert result.exit_code == 0
    assert (tmp_path / "h" / "rank0" / "stderr.log").stat().st_size == 2_000_001
    assert (tmp_path / "h" / "rank0" / "stdout.log").stat().st_size == 2_000_001


@pytest.mark.slow
def test_a_flooding_rank_does_not_starve_a_quiet_one_nor_split_lines(tmp_path, marker, ready):
    ranks = [
        ["ready", ready, "flood", "100000000", "sleep", "60"],
        ["wait-ready", f"1@{ready}", "sleep", "0.2", "out", hx(b"quiet\n"), "exit", "5"],
    ]
    agent = Agent(tmp_path, marker, ranks)
    assert agent.wait(timeout=120) == 5
    lines = agent.stdout().split(b"\n")
    assert lines.pop() == b""
    assert b"[h:1] quiet" in lines
    flood = b"[h:0] " + b"x" * 99
    assert all(line == flood for line in lines if line != b"[h:1] quiet")
    assert len(lines) > 1
    assert marked(marker) == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_cpus_become_the_ranks_exact_affinity(marker, capfd):
    allowed = sorted(os.sched_getaffinity(0))
    procs = [
        rank(0, "affinity", "-", marker=marker, cpus=frozenset(allowed[:1])),
        rank(1, "affinity", "-", marker=marker),
    ]
    run_group(procs)
    out = capfd.readouterr().out
    assert f"[h:0] affinity={allowed[0]}\n" in out
    assert f"[h:1] affinity={','.join(map(str, allowed))}\n" in out
    assert sorted(os.sched_getaffinity(0)) == allowed


def test_agent_memory_stays_small(tmp_path, marker):
    agent = Agent(tmp_path, marker, [["exit", "0"]] * 4)
    assert agent.wait() == 0
    assert agent.result()["max_rss_kib"] < 32 * 1024


def test_a_killed_watchdog_does_not_disturb_the_run(marker, ready, tmp_path, capfd):
    go = str(tmp_path / "go")
    group = RankGroup(
        [rank(0, "ready", ready, "wait-file", go, "exit", "0", marker=marker)], SuperviseOptions(host="h")
    )
    read_fd, write_fd = os.pipe()

    def kill_watchdog() -> None:
        os.read(read_fd, 10)
        assert group._watchdog is not None
        os.kill(group._watchdog.pid, signal.SIGKILL)
        open(go, "w").close()

    group.add_reader(read_fd, kill_watchdog)
    helper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os,time\nwhile not os.listdir({ready!r}): time.sleep(0.005)\nos.write({write_fd}, b'x')",
        ],
        pass_fds=(write_fd,),
    )
    try:
        result = group.run()
    finally:
        helper.wait()
        os.close(read_fd)
        os.close(write_fd)
    assert result.exit_code == 0
    assert proctable.read_proc(group._watchdog.pid) is None  # reaped, not a zombie


def test_without_pidfd_sigchld_and_a_short_poll_do_the_job(marker, ready, capfd):
    # Linux < 5.3 (RHEL 7 clusters) has no pidfd_open: exits come from SIGCHLD, leftovers from a 20 ms recheck.
    procs = [
        rank(0, "ready", ready, "sleep", "60", marker=marker),
        rank(1, "fork", "term", "ready", ready, "then", "-", "wait-ready", f"2@{ready}", "exit", "4", marker=marker),
    ]
    group = RankGroup(procs, SuperviseOptions(host="h"))
    group._have_pidfd = False
    result = group.run()
    (child,) = ready_pids(ready, "child")
    assert result.exit_code == 4
    assert result.outcomes[0].signal == signal.SIGTERM and result.outcomes[0].stopped_by_xrun
    assert result.outcomes[1].leftovers == (child,)
    assert marked(marker) == []
