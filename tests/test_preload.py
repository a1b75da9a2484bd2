"""Forking ranks from a preloaded helper (xrun.launch.preload, issue 32), with real processes.

The helper here preloads a light module (``json``) unless a test is about torch (marked slow: the helper and each
fresh rank import torch). A rank forked from the helper is compared with the same command started by Popen the
way xrun.launch.ranks.spawn starts one: tests/procs/preload_probe.py reports what a rank can see of its start, and
the two reports must agree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from xrun.common.preload.argv import Mode, NotForkable, fork_refusal, has_flag, parse_python_argv
from xrun.errors import PreloadError
from xrun.launch.preload import wire
from xrun.launch.preload.become import pythonpath_entries
from xrun.launch.preload.client import ForkFailed, HelperGone, PreloadHelper
from xrun.launch.procs import proctable

PROCS = os.path.join(ROOT, "tests", "procs")
PROBE = os.path.join(PROCS, "preload_probe.py")
PY = sys.executable
WAIT = 60.0


# ---------------------------------------------------------------------------------------------------------------
# Pure: the command line as python reads it, the wire.


@pytest.mark.parametrize(
    "argv, options, mode, target, args",
    [
        ([PY, "-u", "t.py", "--lr", "3"], ("-u",), Mode.SCRIPT, "t.py", ("--lr", "3")),
        ([PY, "t.py"], (), Mode.SCRIPT, "t.py", ()),
        ([PY, "-u", "-m", "pkg.mod", "-c", "x"], ("-u",), Mode.MODULE, "pkg.mod", ("-c", "x")),
        ([PY, "-um", "mod", "a"], ("-u",), Mode.MODULE, "mod", ("a",)),
        ([PY, "-mmod"], (), Mode.MODULE, "mod", ()),
        ([PY, "-c", "print(1)", "a"], (), Mode.COMMAND, "print(1)", ("a",)),
        ([PY, "-u", "--", "-weird.py", "-u"], ("-u",), Mode.SCRIPT, "-weird.py", ("-u",)),
        ([PY, "-W", "ignore", "-X", "dev", "-uB", "t.py"], ("-W", "ignore", "-X", "dev", "-uB"), Mode.SCRIPT, "t.py", ()),
        ([PY, "-Wignore", "t.py"], ("-Wignore",), Mode.SCRIPT, "t.py", ()),
        ([PY, "--check-hash-based-pycs", "never", "t.py"], ("--check-hash-based-pycs", "never"), Mode.SCRIPT, "t.py", ()),
    ],
)
def test_a_command_line_is_read_as_python_reads_it(argv, options, mode, target, args):
    command = parse_python_argv(argv)
    assert (command.python, command.options, command.mode, command.target, command.args) == (
        PY, options, mode, target, args)


@pytest.mark.parametrize(
    "argv, says",
    [
        ([], "empty"),
        ([PY], "REPL"),
        ([PY, "-u"], "REPL"),
        ([PY, "-i", "t.py"], "-i"),
        ([PY, "-"], "stdin"),
        ([PY, "--version"], "--version"),
        ([PY, "-m"], "-m needs an argument"),
        ([PY, "-W"], "-W needs an argument"),
        ([PY, "-Z", "t.py"], "unknown interpreter option -Z"),
        ([PY, "--"], "stdin"),
    ],
)
def test_a_command_that_runs_no_program_is_not_forkable(argv, says):
    with pytest.raises(NotForkable, match=says):
        parse_python_argv(argv)


def test_has_flag_reads_option_clusters_and_skips_arguments():
    assert has_flag(("-u",), "u") and has_flag(("-Bu",), "u")
    assert not has_flag(("-W", "u"), "u") and not has_flag(("-Wu",), "u") and not has_flag(("-X", "-u"), "u")
    assert not has_flag((), "u")


def test_only_the_helpers_interpreter_and_options_can_be_forked():
    assert fork_refusal(parse_python_argv([PY, "-u", "t.py"]), PY, ("-u",)) is None
    assert "interpreter '/other/python'" in fork_refusal(parse_python_argv(["/other/python", "-u", "t.py"]), PY, ("-u",))
    assert "options -O -u" in fork_refusal(parse_python_argv([PY, "-O", "-u", "t.py"]), PY, ("-u",))
    assert "(none)" in fork_refusal(parse_python_argv([PY, "t.py"]), PY, ("-u",))
    assert ".pyc" in fork_refusal(parse_python_argv([PY, "-u", "t.pyc"]), PY, ("-u",))
    with pytest.raises(NotForkable):  # numactl in front: not python at all
        parse_python_argv(["numactl", "--cpunodebind=0", PY, "t.py"])


def test_pythonpath_entries_are_made_as_getpath_makes_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert pythonpath_entries("") == []
    assert pythonpath_entries("/a::b:/a/../c/") == ["/a", str(tmp_path), str(tmp_path / "b"), "/c"]
    shown = subprocess.run([PY, "-c", "import sys; print(sys.path[1:5])"], env={**os.environ, "PYTHONPATH": "/a::b:/a/../c/"},
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert shown.strip() == repr(pythonpath_entries("/a::b:/a/../c/"))


def test_every_message_survives_the_wire_with_its_descriptors():
    import socket

    a, b = socket.socketpair()
    order = wire.ForkOrder(("py", "-u", "t.py", "é\udcff"), {"A": "1", "B": "x\ny"}, "/tmp", (0, 1), (1,))
    messages = [wire.Preload(("torch",), "/d", ("-u",)), wire.Importing("torch"), wire.Ready(7, 1.5, None),
                wire.Refused("no"), order, wire.Forked(9), wire.ForkFailed("why")]
    r, w = os.pipe()
    try:
        for message in messages:
            wire.send(a, message, (r, w, r) if message is order else ())
            got, fds = wire.recv(b, max_fds=3)
            assert got == message
            assert len(fds) == (3 if message is order else 0)
            for fd in fds:
                os.close(fd)
    finally:
        os.close(r)
        os.close(w)
        a.close()
        b.close()


def test_a_malformed_or_oversized_frame_is_a_protocol_error_and_eof_is_gone():
    import socket

    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"\x00\x00\x00\x02{}")
        with pytest.raises(wire.ProtocolError):
            wire.recv(b)
        a.sendall((wire.MAX_FRAME + 1).to_bytes(4, "big"))
        with pytest.raises(wire.ProtocolError, match="over"):
            wire.recv(b)
        a.shutdown(socket.SHUT_WR)
        b.recv(1 << 20)
        with pytest.raises(wire.Gone):
            wire.recv(b)


# ---------------------------------------------------------------------------------------------------------------
# Real processes: the helper and the ranks it forks.


@pytest.fixture
def subreaper():
    """The test process plays the agent: the ranks' child subreaper while it forks them. What the ranks left
    (multiprocessing's helpers outlive their rank by a moment) comes to it and is reaped at the end, as
    RankGroup reaps it; none may be left running."""
    previous = proctable.set_child_subreaper(True)
    before = proctable.children() or set()
    yield
    deadline = time.monotonic() + WAIT
    while (left := (proctable.children() or set()) - before) and time.monotonic() < deadline:
        for pid in left:
            proctable.reap(pid)
        time.sleep(0.01)
    if previous is not None:
        proctable.set_child_subreaper(previous)
    assert not left, f"left running: {[proctable.read_proc(pid) for pid in left]}"


def start_helper(modules=("json",), env=None, path0=PROCS, options=("-u",)) -> PreloadHelper:
    env = env or {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONFAULTHANDLER", None)
    return PreloadHelper.start(list(modules), python=PY, options=options, env=env, cwd=PROCS, path0=path0)


@pytest.fixture
def helper(subreaper):
    helper = start_helper()
    helper.wait_ready(WAIT)
    yield helper
    helper.close()


def started(argv, env, cwd):
    """A rank started as xrun.launch.ranks.spawn starts one: (exit status, stdout, stderr, rusage)."""
    proc = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, close_fds=True, bufsize=0)
    out, err = proc.communicate(timeout=WAIT)
    return proc.returncode, out, err


def forked(helper, argv, env, cwd, cpus=None):
    """The same rank forked from ``helper``: (exit status as Popen says it, stdout, stderr)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        rank = helper.fork(argv, env, cwd=cwd, cpus=cpus, stdout=out_w, stderr=err_w)
    finally:
        os.close(out_w)
        os.close(err_w)
    rank.release()
    with open(out_r, "rb") as out, open(err_r, "rb") as err:
        stdout, stderr = out.read(), err.read()
    _, status, _ = os.wait4(rank.pid, 0)
    return os.waitstatus_to_exitcode(status), stdout, stderr


def probe_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "PYTHONPATH")}
    return {**env, "PROBE_VAR": "é x", "RANK": "3",
            "PYTHONDONTWRITEBYTECODE": "1", **extra}  # the helper's (start_helper): sys.flags records it


def report(out: bytes) -> dict:
    return json.loads(out.decode().splitlines()[-1])


@pytest.mark.parametrize(
    "argv, cwd",
    [
        ((PY, "-u", PROBE, "a b", "--x=1"), ROOT),
        ((PY, "-u", os.path.relpath(PROBE, PROCS), "mp=1"), PROCS),
        ((PY, "-u", "-m", "preload_probe", "z"), PROCS),
        ((PY, "-u", "-c", "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')", PROBE), PROCS),
    ],
    ids=["script", "relative-script-mp", "module", "command"],
)
def test_a_forked_rank_sees_what_a_started_one_sees(helper, argv, cwd):
    env = probe_env(PYTHONPATH=f"/nonexistent{os.pathsep}{ROOT}")  # another PYTHONPATH than the helper's
    code_s, out_s, err_s = started(argv, env, cwd)
    code_f, out_f, err_f = forked(helper, argv, env, cwd)
    assert (code_s, err_s) == (0, b"")
    assert (code_f, err_f) == (0, b"")
    fresh, fork = report(out_s), report(out_f)
    assert fork == fresh
    assert fork["session_leader"] and fork["group_leader"] and fork["ppid"] == os.getpid()
    assert fork["cmdline"] == list(argv) and fork["comm"] == os.path.basename(PY)[:15]
    assert not fork["xrun_loaded"]


def test_start_up_variables_are_read_from_the_ranks_environment(helper):
    """The helper runs with PYTHONDONTWRITEBYTECODE and without PYTHONFAULTHANDLER; this rank the other way round.
    What they do follows the rank; sys.flags, the record of the interpreter's own start, stays the helper's, and
    faulthandler's handlers, installed after python's signal module started, show as SIG_DFL (not None) to
    signal.getsignal (docs/preload.md)."""
    env = probe_env(PYTHONFAULTHANDLER="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = (PY, "-u", PROBE)
    fresh, fork = report(started(argv, env, ROOT)[1]), report(forked(helper, argv, env, ROOT)[1])
    assert fork["faulthandler"] is fresh["faulthandler"] is True
    assert fork["dont_write_bytecode"] is fresh["dont_write_bytecode"] is False
    assert fork["flags"][4] == 1 and fresh["flags"][4] == 0  # sys.flags.dont_write_bytecode: the helper's start
    assert fresh["signals"]["SIGSEGV"] == "None" and fork["signals"]["SIGSEGV"] == "SIG_DFL"


def test_ignored_signals_stay_ignored_and_others_are_pythons_defaults(helper):
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup: Popen'd ranks inherit it ignored
    try:
        argv, env = (PY, "-u", PROBE), probe_env()
        fresh, fork = report(started(argv, env, ROOT)[1]), report(forked(helper, argv, env, ROOT)[1])
    finally:
        signal.signal(signal.SIGHUP, old)
    assert fork["signals"] == fresh["signals"]
    assert fork["signals"]["SIGHUP"] == "SIG_IGN" and fork["signals"]["SIGPIPE"] == "SIG_IGN"
    assert fork["signals"]["SIGINT"] == "default_int_handler" and fork["signals"]["SIGTERM"] == "SIG_DFL"


def test_without_u_output_is_buffered_as_python_buffers_it(subreaper):
    helper = start_helper(options=())
    try:
        helper.wait_ready(WAIT)
        argv, env = (PY, PROBE), probe_env()
        fresh, fork = report(started(argv, env, ROOT)[1]), report(forked(helper, argv, env, ROOT)[1])
        assert fork["stdout"] == fresh["stdout"] and fork["stdout"]["type"] == "BufferedWriter"
        assert fork["flags"] == fresh["flags"]
    finally:
        helper.close()


@pytest.mark.parametrize(
    "program",
    [
        "raise ValueError('boom')",
        "import sys; sys.exit(3)",
        "import sys; sys.exit('a message')",
        "raise SystemExit",
        "import os, signal; os.kill(os.getpid(), signal.SIGINT); import time; time.sleep(5)",
        "def f(:\n  pass",
        "import atexit, threading, time\natexit.register(print, 'atexit ran')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined'))).start()\nraise KeyError(1)",
    ],
    ids=["exception", "exit-3", "exit-message", "bare-exit", "sigint", "syntax-error", "atexit-and-threads"],
)
def test_an_uncaught_exception_ends_the_rank_as_it_ends_python(helper, tmp_path, program):
    script = tmp_path / "program.py"
    script.write_text(program + "\n")
    argv, env = (PY, "-u", str(script)), probe_env()
    assert forked(helper, argv, env, str(tmp_path)) == started(argv, env, str(tmp_path))


def test_a_missing_script_or_module_says_what_python_says(helper, tmp_path):
    env = probe_env()
    for argv in ((PY, "-u", "missing.py"), (PY, "-u", "-m", "no_such_module_here")):
        result = forked(helper, argv, env, str(tmp_path))
        assert result == started(argv, env, str(tmp_path))
        assert result[0] != 0 and result[2]


def test_ps_shows_the_rank_and_its_environment_while_it_runs(helper):
    import psutil

    env = probe_env(XRUN_TEST_MARK="preload-ps")
    out_r, out_w = os.pipe()
    rank = helper.fork((PY, "-u", PROBE, "sleep=30"), env, cwd=ROOT, cpus=None, stdout=out_w, stderr=out_w)
    os.close(out_w)
    try:
        rank.release()
        with open(out_r, "rb") as out:
            assert out.readline() == b"up\n"
            proc = psutil.Process(rank.pid)
            assert proc.cmdline() == [PY, "-u", PROBE, "sleep=30"]
            assert proc.environ()["XRUN_TEST_MARK"] == "preload-ps"
            shown = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(rank.pid)], capture_output=True, text=True)
            assert shown.stdout.strip() == f"{PY} -u {PROBE} sleep=30"
            assert proc.ppid() == os.getpid()
    finally:
        os.kill(rank.pid, signal.SIGKILL)
        os.waitpid(rank.pid, 0)


def test_cpus_and_the_working_directory_are_the_ranks(helper, tmp_path):
    cpus = frozenset({min(os.sched_getaffinity(0))})
    env = probe_env()
    code, out, _ = forked(helper, (PY, "-u", PROBE), env, str(tmp_path), cpus=cpus)
    assert code == 0 and report(out)["affinity"] == sorted(cpus) and report(out)["cwd"] == str(tmp_path)


def test_an_order_the_helper_cannot_fork_is_refused_and_the_helper_serves_on(helper, tmp_path):
    env = probe_env()
    with pytest.raises(NotForkable, match="options"):
        helper.fork((PY, "-O", PROBE), env, cwd=ROOT, cpus=None, stdout=1, stderr=2)
    with pytest.raises(ForkFailed, match="No such directory"):
        helper.fork((PY, "-u", PROBE), env, cwd=str(tmp_path / "gone"), cpus=None, stdout=1, stderr=2)
    assert forked(helper, (PY, "-u", PROBE), env, ROOT)[0] == 0


# -- the helper's start: what cannot be preloaded -----------------------------------------------------------------


@pytest.mark.parametrize(
    "module, says",
    [
        ("no_such_module_xyz", "--preload: cannot import 'no_such_module_xyz' (ModuleNotFoundError: No module named "
                               "'no_such_module_xyz'): install it for "),
        ("preload_raises", "--preload: cannot import 'preload_raises' (RuntimeError: refusing to load here): "),
        ("preload_thread", "--preload: importing 'preload_thread' started 1 Python thread(s) (ticker) that a fork "
                           "would not copy: leave 'preload_thread' out of --preload"),
        ("preload_native_thread", "--preload: importing 'preload_native_thread' left 1 native thread(s) running "
                                  "through a fork"),
        pytest.param("preload_cuda", "--preload: importing 'preload_cuda' initialised CUDA, and a rank forked after "
                                     "that cannot use the GPU", marks=pytest.mark.slow),
    ],
)
def test_a_module_that_cannot_be_preloaded_is_one_line_and_exit_2(subreaper, module, says):
    helper = start_helper(("json", module))
    with pytest.raises(PreloadError) as caught:
        helper.wait_ready(WAIT)
    assert str(caught.value).startswith(says) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2 and caught.value.module == module
    assert helper.lost() == "exited with code 2"


def test_a_helper_that_dies_while_importing_names_the_module(subreaper):
    helper = start_helper(("json", "preload_slow"))
    deadline = time.monotonic() + WAIT
    while open(f"/proc/{helper.pid}/comm").read().strip() != "preload_slow":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(helper.pid, signal.SIGKILL)
    with pytest.raises(PreloadError, match=r"the helper \(pid \d+\) was killed by SIGKILL while importing "
                                           "'preload_slow'"):
        helper.wait_ready(WAIT)


def test_the_helper_never_holds_a_second_thread_nor_the_agents_descriptors(helper):
    assert len(os.listdir(f"/proc/{helper.pid}/task")) == 1
    fds = {os.readlink(f"/proc/{helper.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{helper.pid}/fd")}
    assert len(fds) <= 4  # its stdin (/dev/null), stdout and stderr (the agent's stderr), its socket
    assert os.getsid(helper.pid) == helper.pid  # its own session: the terminal's Ctrl-C is the agent's to pass on


# -- the helper dying -------------------------------------------------------------------------------------------


def test_a_killed_helper_is_noticed_and_the_next_fork_says_so(helper):
    os.kill(helper.pid, signal.SIGKILL)
    import select

    assert select.select([helper], [], [], WAIT)[0]  # its socket tells at once
    assert helper.lost() == "was killed by SIGKILL"
    with pytest.raises(HelperGone, match=r"the preload helper \(pid \d+\) was killed by SIGKILL"):
        helper.fork((PY, "-u", PROBE), probe_env(), cwd=ROOT, cpus=None, stdout=1, stderr=2)


def test_a_rank_forked_while_the_helper_is_killed_never_runs(subreaper, tmp_path):
    """tests/procs/preload_slowfork.py makes every fork slow (and says when one began): the helper is killed once
    its middle process exists, so no answer ever comes; the rank the middle process still forks must leave."""
    marker = f"preload-orphan-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "PRELOAD_FORK_DIR": str(tmp_path)}
    helper = start_helper(("preload_slowfork",), env=env)
    helper.wait_ready(WAIT)
    for name in os.listdir(tmp_path):  # the helper's trial forks
        os.remove(tmp_path / name)
    ran = tmp_path / "ran"
    program = tmp_path / "program.py"
    program.write_text(f"open({str(ran)!r}, 'w').close()\nimport time\ntime.sleep(60)\n")
    import threading

    def kill_when_forking():
        deadline = time.monotonic() + WAIT
        while not any(name.startswith("fork-") for name in os.listdir(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(helper.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_forking)
    killer.start()
    try:
        with pytest.raises(HelperGone, match="killed by SIGKILL"):
            helper.fork((PY, "-u", str(program)), probe_env(XRUN_TEST_MARK=marker), cwd=str(tmp_path), cpus=None,
                        stdout=1, stderr=2)
    finally:
        killer.join()
    time.sleep(2.0)  # the middle process's slow fork ends, the rank wakes to the closed hold pipe
    from tests.cluster.harness import processes_with_marker

    assert processes_with_marker(f"XRUN_TEST_MARK={marker}") == []
    assert not ran.exists()
    forks = [int(name.split("-")[1]) for name in os.listdir(tmp_path) if name.startswith("fork-")]
    for pid in forks:  # the middle process and the rank: gone (their zombies are the subreaper fixture's)
        info = proctable.read_proc(pid)
        assert info is None or not info.alive, f"{pid} still running"

