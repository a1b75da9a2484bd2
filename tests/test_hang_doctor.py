"""The hang doctor (issue 14): stacks on demand, the hang watchdog, stacks at failure, where stacks cannot be taken.

Pure tables first (the compact view, the merge, py-spy's JSON, the silence watch, the head's doctor, the flags),
then real runs: local jobs through the xrun entry point, and three agents over the control channel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

import xrun
import xrun.launch.doctor.node_doctor as node_doctor
import xrun.launch.preload as preload_package
from tests.cluster.harness import processes_with_marker
from tests.conftest import ROOT
from tests.headserver import endpoint_of, head_server
from tests.test_control import LocalSessions
from tests.test_pod_run import Pod
from xrun.channel import Kind, message
from xrun.common.agent_cli import parse_agent_argv
from xrun.common.command import agent_argv
from xrun.common.output.status import PlainStatus
from xrun.common.rankplan import LaunchOptions
from xrun.common.result.outcome import HANG_EXIT
from xrun.common.result.stacks import Frame, RankStack, ThreadStack
from xrun.common.result.stackview import compact, full_text, merge, rank_ranges, render
from xrun.common.spec import AgentOptions, HangAction
from xrun.errors import XrunError
from xrun.launch.doctor.node_doctor import (
    READERS_AFTER,
    SAMPLE_EVERY,
    NodeDoctor,
    QuietWatch,
    Silence,
    until_the_next_sample,
)
from xrun.launch.doctor.stackdump import (
    EXITED,
    PTRACE_HINT,
    dump_ranks,
    explain,
    has_exited,
    parse_dump,
    pyspy_path,
    stack_problem,
)
from xrun.launch.procs.proctable import cpu_wait
from xrun.launch.ranks.plugins import Plugins
from xrun.launch.ranks.supervise import DumpTarget
from xrun.runner.job.config import JobConfig
from xrun.runner.job.doctor import COLLECT_FOR, Hang, HeadDoctor, Send, Show
from xrun.runner.job.events import Hung, SignalReceived
from xrun.runner.job.machine import Job
from xrun.runner.plan import JobRequest, make_plan


def thread(*frames: tuple[str, str, int]) -> ThreadStack:
    return ThreadStack("MainThread", tuple(Frame(name, filename, line) for name, filename, line in frames))


TRAIN = ("<module>", "/job/train.py", 120)
STEP_88 = ("step", "/job/train.py", 88)
STEP_91 = ("step", "/job/train.py", 91)
NEXT = ("__next__", "/venv/site-packages/mylib/loader.py", 30)
GET = ("get", "/usr/lib/python3.11/queue.py", 171)
ALL_REDUCE = ("all_reduce", "/venv/site-packages/torch/distributed/distributed_c10d.py", 2500)


@pytest.mark.parametrize(
    ("frames", "text"),
    [
        ((TRAIN, STEP_88, NEXT, GET), "train.py:88 step > loader.__next__ > queue.get"),
        ((TRAIN, STEP_91, ALL_REDUCE), "train.py:91 step > distributed_c10d.all_reduce"),
        ((TRAIN,), "train.py:120 <module>"),
        ((("_run_module_as_main", "<frozen runpy>", 198), ("_run_code", "<frozen runpy>", 88), TRAIN, STEP_88),
         "train.py:88 step"),  # python -m: runpy's frames are not the script's
        ((TRAIN, STEP_88, *[(f"f{i}", f"/lib/m{i}.py", i) for i in range(9)]),
         "train.py:88 step > m0.f0 > m1.f1 > ... > m6.f6 > m7.f7 > m8.f8"),
        ((), "(no Python frames)"),
    ],
)
def test_compact(frames, text):
    assert compact(thread(*frames)) == text


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([0], "0"), ([0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15], "0-6, 8-15"), ([5, 3, 1], "1, 3, 5"),
     ([2, 3, 3], "2-3"), ([], "")],
)
def test_rank_ranges(ranks, text):
    assert rank_ranges(ranks) == text


def stack(rank: int, *frames, host: str | None = None, error: str | None = None) -> RankStack:
    threads = () if error else (thread(*frames),)
    return RankStack(host or f"node{rank // 8}", rank, rank % 8, 1000 + rank, threads, error)


def test_merge_puts_the_outlier_first_as_in_the_issue():
    stacks = [stack(r, TRAIN, STEP_91, ALL_REDUCE) for r in range(16) if r != 7] + [stack(7, TRAIN, STEP_88, NEXT, GET)]
    assert render(merge(stacks)) == [
        "rank 7 (node0, local 7): train.py:88 step > loader.__next__ > queue.get",
        "ranks 0-6, 8-15: train.py:91 step > distributed_c10d.all_reduce",
    ]


def test_merge_groups_ranks_without_a_stack_by_why():
    stacks = [stack(0, TRAIN), stack(1, error="no permission"), stack(2, error="no permission"), stack(3, TRAIN)]
    assert render(merge(stacks)) == ["ranks 0, 3: train.py:120 <module>", "ranks 1-2: no stack: no permission"]


def test_full_text_has_every_thread_traceback_style():
    text = full_text([stack(1, TRAIN, STEP_88), stack(0, error="gone")], title="xrun: stacks")
    assert text.splitlines()[:4] == ["xrun: stacks", "", "rank 0 (node0, local 0, pid 1000)", "  no stack: gone"]
    assert '    File "/job/train.py", line 88, in step' in text.splitlines()


PYSPY_JSON = json.dumps([
    {"pid": 7, "thread_id": 2, "thread_name": "pt_autograd_0", "frames": [
        {"name": "run", "filename": "/t.py", "line": 4}]},
    {"pid": 7, "thread_id": 1, "thread_name": "MainThread", "frames": [
        {"name": "step", "filename": "/train.py", "line": 88}, {"name": "<module>", "filename": "/train.py", "line": 9}]},
])


def test_parse_dump_puts_the_main_thread_first_and_the_outermost_frame_first():
    threads = parse_dump(PYSPY_JSON)
    assert [t.name for t in threads] == ["MainThread", "pt_autograd_0"]
    assert threads[0].frames == (Frame("<module>", "/train.py", 9), Frame("step", "/train.py", 88))
    for garbage in ("", "{", '{"a": 1}', '[{"frames": [{"name": "x"}]}]'):
        with pytest.raises(ValueError):
            parse_dump(garbage)


def test_a_forked_ranks_stack_leaves_out_the_preload_helpers_frames_below_its_program():
    helper = os.path.dirname(preload_package.__file__)  # the installed package's, where a forked rank runs it
    below = [{"name": "_execute", "filename": f"{helper}/become.py", "line": 290},
             {"name": "become", "filename": f"{helper}/become.py", "line": 100},
             {"name": "main", "filename": f"{helper}/helper.py", "line": 70},
             {"name": "<module>", "filename": "<string>", "line": 1}]
    program = [{"name": "step", "filename": "/train.py", "line": 88}, {"name": "<module>", "filename": "/train.py",
                                                                       "line": 9}]
    forked = json.dumps([{"thread_name": "MainThread", "frames": program + below}])
    assert parse_dump(forked)[0].frames == (Frame("<module>", "/train.py", 9), Frame("step", "/train.py", 88))
    user = json.dumps([{"thread_name": "MainThread", "frames": [*program, below[-1]]}])  # python -c: kept whole
    assert len(parse_dump(user)[0].frames) == 3


@pytest.mark.parametrize(
    ("stderr", "says"),
    [
        ("Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'",
         PTRACE_HINT),
        ("Error: Failed to find python version from target process", "py-spy: Error: Failed to find python"),
        ("", "py-spy printed nothing"),
    ],
)
def test_explain(stderr, says):
    assert says in explain(stderr)


def test_stack_problem_names_the_missing_py_spy_and_the_fix(tmp_path):
    assert stack_problem("n1", {"PATH": str(tmp_path)}, scripts=str(tmp_path)) == (
        "no stacks from n1: py-spy is not installed there (pip install py-spy, in the environment of the agent's "
        "python); the job goes on"
    )
    if shutil.which("py-spy"):
        assert stack_problem("n1") is None


def test_py_spy_beside_the_interpreter_comes_before_path(tmp_path):
    beside, on_path = tmp_path / "venv-bin", tmp_path / "path-bin"
    for directory in (beside, on_path):
        directory.mkdir()
        (directory / "py-spy").write_text("#!/bin/sh\n")
        (directory / "py-spy").chmod(0o755)
    assert pyspy_path({"PATH": str(on_path)}, scripts=str(beside)) == str(beside / "py-spy")
    assert pyspy_path({"PATH": str(on_path)}, scripts=str(tmp_path)) == str(on_path / "py-spy")
    assert pyspy_path({"PATH": str(on_path), "XRUN_PYSPY": str(on_path / "py-spy")}, scripts=str(beside)) == str(
        on_path / "py-spy")


def test_rank_stack_survives_the_wire_and_malformed_ones_are_refused():
    original = stack(3, TRAIN, STEP_88)
    assert RankStack.from_json(json.loads(json.dumps(original.to_json()))) == original
    for broken in ({}, {**original.to_json(), "threads": [{"name": "x", "frames": [["a", "b"]]}]}):
        with pytest.raises(ValueError):
            RankStack.from_json(broken)


# -- the silence watch (node) and the head's doctor ------------------------------------------------------------


def test_quiet_watch_reports_one_silence_and_its_end():
    watch = QuietWatch(4.0, now=100.0)
    assert watch.interval == 1.0 and watch.next_check == 101.0
    seen = [(t, watch.check(t, heard)) for t, heard in
            [(101, True), (102, False), (104, False), (105, False), (106, False), (107, False), (108, True),
             (109, False), (112, False)]]
    assert seen == [(101, None), (102, None), (104, None), (105, Silence.QUIET), (106, None), (107, None),
                    (108, Silence.SPOKE), (109, None), (112, Silence.QUIET)]
    assert QuietWatch(0.4, now=0).interval == 0.1


@pytest.mark.parametrize("failure_stacks", [True, False])
def test_the_doctor_loads_its_readers_half_a_second_of_its_ranks_own_time_into_a_run(failure_stacks, monkeypatch):
    # issue 38: nothing reads a rank at a fan-out's start; a run that lasts loads the readers before a failure's
    # stop would wait for them (--failure_stacks), and without that, at the first dump or sample only. What a rank
    # waited for a CPU is not its own time: a busy machine's no-op ranks, still starting, are no job yet
    waited = {7: 0.25, 8: 0.375}  # seconds each rank (by pid) was runnable without a CPU
    group = types.SimpleNamespace(plugins=Plugins(), live_targets=lambda: [DumpTarget(0, 0, 7), DumpTarget(1, 1, 8)])
    monkeypatch.setattr(node_doctor, "cpu_wait", waited.__getitem__)
    doctor = NodeDoctor("h", AgentOptions(failure_stacks=failure_stacks))
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    doctor.attach(group)
    assert doctor._dumps is None and group.plugins.timers.timeout(None) == (READERS_AFTER if failure_stacks else None)
    clock[0] += READERS_AFTER
    group.plugins.timers.run()
    if failure_stacks:  # rank 0 has lived 0.25 s of its own: again when it could have lived READERS_AFTER
        assert doctor._dumps is None and group.plugins.timers.timeout(None) == 0.25
        clock[0] += 0.25
        group.plugins.timers.run()
    assert (doctor._dumps is not None) is failure_stacks
    assert group.plugins.timers.timeout(None) is None  # loaded once; the timer is done


def test_cpu_wait_is_the_kernels_count_for_a_live_process_and_nothing_for_a_gone_one():
    def schedstat(pid):  # run_delay in ns; a kernel without schedstats has no such file
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                return int(f.read().split()[1]) / 1e9
        except OSError:
            return 0.0

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # busy: its count may grow meanwhile
    try:
        before = schedstat(child.pid)
        assert before <= cpu_wait(child.pid) <= schedstat(child.pid)
    finally:
        child.kill()
        child.wait()
    assert cpu_wait(child.pid) == 0.0


def head(hang_timeout=None, action=HangAction.DUMP, tmp_path=None):
    return HeadDoctor(("a", "b", "c").__getitem__, hang_timeout=hang_timeout, hang_action=action,
                      log_dir=str(tmp_path) if tmp_path else None)


def stacks_msg(serial, *stacks, problem=None):
    return message(Kind.STACKS, id=serial, stacks=[s.to_json() for s in stacks], problem=problem)


def test_head_dump_asks_the_running_nodes_and_shows_the_merge_once_all_answered(tmp_path):
    doctor = head(tmp_path=tmp_path)
    assert doctor.want("SIGQUIT", [2, 0], now=10.0) == [Send((0, 2), message(Kind.DUMP, id=1, reason="SIGQUIT"))]
    assert doctor.want("SIGQUIT", [0, 2], now=10.5) == [Show(("SIGQUIT: a stack dump is already being collected",))]
    assert doctor.deadline() == 10.0 + COLLECT_FOR
    assert doctor.stacks(0, stacks_msg(1, stack(0, TRAIN, STEP_91), stack(1, TRAIN, STEP_91)), now=11.0) == []
    assert doctor.stacks(1, stacks_msg(1, stack(9, TRAIN)), now=11.0) == []  # not asked: ignored
    [show] = doctor.stacks(2, stacks_msg(1, stack(2, TRAIN, STEP_88)), now=11.2)
    assert show.lines[0].startswith("SIGQUIT: stacks of 3 ranks, outliers first; full dumps in " + str(tmp_path))
    assert show.lines[1:] == ("  rank 2 (node0, local 2): train.py:88 step", "  ranks 0-1: train.py:91 step")
    assert doctor.deadline() is None and len(list(tmp_path.iterdir())) == 1
    [dump] = tmp_path.iterdir()
    assert show.lines[0].endswith(f"full dumps in {dump}")  # the whole path, absolute
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600  # stacks show arguments and paths: the owner's only


def test_a_dump_never_follows_a_link_and_its_name_cannot_be_guessed(tmp_path, monkeypatch):
    from xrun.common.result.dumpfile import write_dump_file

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # without --log_dir: the temporary directory
    monkeypatch.chdir(tmp_path / "..")  # never the working directory
    victim = tmp_path / "victim"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
    for ms in range(1000):  # every name the old scheme could pick within this second, as links
        (tmp_path / f"xrun-stacks-{stamp}-{ms:03d}.txt").symlink_to(victim)
    first, second = write_dump_file(None, "one"), write_dump_file(None, "two")
    assert not victim.exists()
    assert first != second and os.path.isabs(first) and os.path.dirname(first) == str(tmp_path)
    assert open(first).read() == "one" and not os.path.islink(first)


def test_head_dump_names_a_node_that_did_not_answer_and_a_late_answer_changes_nothing(tmp_path):
    doctor = head(tmp_path=tmp_path)
    doctor.want("SIGQUIT", [0, 1], now=0.0)
    doctor.stacks(0, stacks_msg(1, stack(0, TRAIN), problem=None), now=0.5)
    assert doctor.check(1.0, [0, 1]) == []
    [show] = doctor.check(COLLECT_FOR, [0, 1])
    assert show.lines[-1] == "no answer in time from b"
    assert doctor.stacks(1, stacks_msg(1, stack(1, TRAIN)), now=COLLECT_FOR + 1) == []


def test_head_shows_a_node_problem_once():
    doctor = head()
    doctor.want("SIGQUIT", [0, 1], now=0.0)
    doctor.stacks(0, stacks_msg(1, problem="no stacks from a: py-spy is not installed there"), now=0.1)
    [show] = doctor.stacks(1, stacks_msg(1, problem="no stacks from a: py-spy is not installed there"), now=0.2)
    assert show.lines == ("SIGQUIT: no stacks came back", "no stacks from a: py-spy is not installed there")


@pytest.mark.parametrize("action", [HangAction.DUMP, HangAction.STOP])
def test_head_hang_needs_every_running_node_quiet_and_dumps_once_per_silence(tmp_path, action):
    doctor = head(5.0, action, tmp_path)
    assert doctor.quiet(0, [0, 1, 2], now=6.0) == []
    assert doctor.quiet(1, [0, 1, 2], now=6.2) == []
    [send] = doctor.quiet(2, [0, 1, 2], now=6.4)
    assert send.nodes == (0, 1, 2) and send.message["reason"].startswith("no rank on any node wrote output for 5 s")
    for node in (0, 1):
        doctor.stacks(node, stacks_msg(1, stack(node, TRAIN)), now=7.0)
    steps = doctor.stacks(2, stacks_msg(1, stack(2, TRAIN, STEP_88)), now=7.1)
    assert steps[0].lines[1] == "  rank 2 (node0, local 2): train.py:88 step"
    reason = "no rank on any node wrote output for 5 s (--hang_timeout); --hang_action stop"
    assert steps[1:] == ([Hang(reason)] if action is HangAction.STOP else [])
    assert doctor.check(20.0, [0, 1, 2]) == []  # the same silence: no second dump
    doctor.spoke(1)
    assert doctor.check(21.0, [0, 1, 2]) == []
    assert [type(s) for s in doctor.quiet(1, [0, 1, 2], now=27.0)] == [Send]  # spoke, then silent again


def test_head_keeps_the_stacks_taken_before_a_stop_apart_from_any_dump():
    doctor = head()
    doctor.want("SIGQUIT", [0, 1], now=0.0)
    assert doctor.stacks(1, stacks_msg("stop", stack(2, TRAIN)), now=0.1) == []
    assert doctor.stop_stacks == [stack(2, TRAIN)] and doctor.deadline() is not None  # the dump still waits


def test_head_hang_counts_only_running_nodes():
    doctor = head(5.0)
    assert doctor.quiet(0, [0, 1], now=6.0) == []
    assert [type(s) for s in doctor.check(7.0, [0])] == [Send]  # node 1 finished: node 0 alone is the job


def test_hung_is_the_root_cause_with_its_own_exit_code():
    job = Job(JobConfig(hosts=("a", "b"), join_timeout=60, shutdown_timeout=30, world_size=2), now=0.0)
    job.handle(Hung("no rank on any node wrote output for 5 s (--hang_timeout); --hang_action stop"), 1.0)
    job.handle(SignalReceived(signal.SIGTERM), 1.1)  # a later signal does not replace it
    verdict = job.verdict()
    assert verdict.exit_code == HANG_EXIT == 124 and verdict.failure.host == "every node"


# -- flags ----------------------------------------------------------------------------------------------------

WORLD = "--world_info=eyJsb2NhbGhvc3QiOlswXX0="


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--hang_timeout", "0"], "--hang_timeout: must be more than 0 seconds, not 0"),
        (["--hang_timeout", "-1"], "--hang_timeout: must be more than 0 seconds, not -1"),
        (["--hang_timeout", "nan"], "is not a number of seconds"),
        (["--hang_timeout", "1e9"], "the most xrun accepts"),
        (["--hang_action", "stop"], "--hang_action: only applies with --hang_timeout"),
        (["--hang_timeout", "5", "--hang_action", "kill"], "invalid choice: 'kill'"),
        (["--hang_timeout", "5", "--elastic"], "--hang_timeout: does not apply with --elastic"),
    ],
)
def test_hang_flags_are_strict(flags, error):
    with pytest.raises(XrunError) as info:
        parse_agent_argv([WORLD, "--node_rank=0", *flags, "x.py"])
    assert error in str(info.value)


def test_hang_flags_reach_the_agent_and_round_trip():
    command = parse_agent_argv([WORLD, "--node_rank=0", "--hang_timeout=2.5", "--hang_action=stop",
                                "--no_failure_stacks", "x.py"])
    assert command.options == AgentOptions(hang_timeout=2.5, hang_action=HangAction.STOP, failure_stacks=False)
    assert parse_agent_argv(agent_argv(command)[4:]) == command
    assert "--hang_timeout" not in " ".join(agent_argv(parse_agent_argv([WORLD, "--node_rank=0", "x.py"])))


def test_hang_flags_travel_in_the_node_spec():
    request = JobRequest(script="x.py", launch=LaunchOptions(python=sys.executable), cwd="/",
                         options=AgentOptions(hang_timeout=7.0, hang_action=HangAction.STOP, failure_stacks=False))
    node = make_plan(request, {"a": (0,), "b": (0,)}, "ssh").nodes[1]
    again = type(node).from_json(json.loads(json.dumps(node.to_json())))
    assert again.options == request.options


# -- real processes: py-spy against live ranks ---------------------------------------------------------------

needs_pyspy = pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed")

SLEEPER = """
import os, time
def load_batch():
    time.sleep(60)
def all_reduce():
    time.sleep(60)
print("rank", os.environ["RANK"], "up", flush=True)
if os.environ["RANK"] == os.environ.get("SLOW_RANK", "2"):
    load_batch()
elif os.environ["RANK"] == os.environ.get("FAIL_RANK"):
    time.sleep(1.5)
    raise SystemExit(3)
else:
    all_reduce()
"""


@needs_pyspy
@pytest.mark.slow
def test_dump_ranks_reads_live_processes_without_stopping_them(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    procs = [subprocess.Popen([sys.executable, str(script)], env={**os.environ, "RANK": str(r)},
                              stdout=subprocess.PIPE) for r in range(3)]
    try:
        for proc in procs:
            proc.stdout.readline()
        targets = [DumpTarget(r, r, p.pid) for r, p in enumerate(procs)] + [DumpTarget(9, 9, 2**22 + 7)]
        started = time.monotonic()
        stacks = dump_ranks("h", targets, budget=5.0, pyspy=shutil.which("py-spy"))
        assert time.monotonic() - started < 5.0
        assert render(merge(stacks[:3])) == ["rank 2 (h, local 2): sleeper.py:4 load_batch",
                                             "ranks 0-1: sleeper.py:6 all_reduce"]
        assert stacks[3].error == EXITED and not stacks[3].threads  # no such process: named, not raised
        assert all(p.poll() is None for p in procs)  # still running
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_has_exited_tells_a_zombie_and_a_missing_pid_from_a_live_process():
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    zombie = subprocess.Popen(["true"])
    try:
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: a zombie
        assert has_exited(zombie.pid) and has_exited(2**22 + 7) and not has_exited(live.pid)
    finally:
        live.kill()
        live.wait()
        zombie.wait()


def start_xrun(tmp_path, *flags, env=None, script=SLEEPER, python=sys.executable):
    path = tmp_path / "job.py"
    path.write_text(script)
    marker = f"xrun-hang-{os.getpid()}-{time.monotonic_ns()}"
    full_env = {**os.environ, "XRUN_TEST_MARKER": marker, **(env or {})}
    full_env.pop("CUDA_VISIBLE_DEVICES", None)
    if "--log_dir" not in flags:  # the full dumps' file goes there, not into the repository (the cwd)
        flags = ("--log_dir", str(tmp_path / "logs"), *flags)
    proc = subprocess.Popen([python, "-m", "xrun", *flags, str(path)], cwd=ROOT, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, marker


def wait_for_lines(stream, count, *, contains, timeout):
    """Read ``stream`` until ``count`` lines containing ``contains`` were seen; return every line read."""
    lines, found = [], 0
    deadline = time.monotonic() + timeout
    while found < count and time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        found += contains in line
    return lines


@needs_pyspy
@pytest.mark.slow
@pytest.mark.parametrize("preload", [(), ("--preload=json",)], ids=["started", "forked"])
def test_sigquit_on_a_healthy_job_prints_every_stack_and_the_job_completes(tmp_path, preload):
    """Ranks forked from --preload's helper (issue 32) give the same stacks, the helper's frames left out."""
    steady = "import os, time\ndef step():\n    time.sleep(0.1)\nprint('up', os.environ['RANK'], flush=True)\nfor i in range(40):\n" \
             "    step()\n"
    proc, _ = start_xrun(tmp_path, "--num_gpus", "3", "--log_dir", str(tmp_path / "logs"), *preload, script=steady)
    wait_for_lines(proc.stdout, 3, contains="up", timeout=30)
    proc.send_signal(signal.SIGQUIT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = err.splitlines()
    # the local run is a one-node job: the head's doctor shows the view, as for a job of several nodes
    head_line = next(line for line in lines if line.startswith("xrun: SIGQUIT at localhost: stacks of 3 ranks"))
    assert "xrun:   ranks 0-2: job.py:3 step" in lines
    path = head_line.split("full dumps in ", 1)[1]
    assert path.startswith(str(tmp_path / "logs")) and "rank 2 (localhost, local 2, pid" in open(path).read()
    assert "3 ranks ok in" in err
    assert ("xrun[localhost]: preloaded json in " in err) == bool(preload)


GLOO = """
import os, time
import torch
import torch.distributed as dist

def load_batch():
    time.sleep(60)

dist.init_process_group("gloo")
rank = dist.get_rank()
print("rank", rank, "up", flush=True)
if rank == 2:
    load_batch()
tensor = torch.ones(1)
dist.all_reduce(tensor)
"""


@needs_pyspy
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("preload", [(), ("--preload=torch",)], ids=["started", "forked"])
def test_hang_timeout_names_the_sleeping_rank_within_20_s(tmp_path, preload):
    """The issue's test: 4 gloo ranks, rank 2 sleeps 60 s before the all-reduce; and the same ranks forked from
    --preload torch's helper (issue 32): the same lines, the helper's frames below job.py left out."""
    pytest.importorskip("torch")
    proc, marker = start_xrun(tmp_path, "--num_gpus", "4", "--master_port", "0", "--hang_timeout", "5", *preload,
                              script=GLOO)
    started = time.monotonic()
    try:
        err = "".join(wait_for_lines(proc.stderr, 1, contains="ranks 0-1, 3: ", timeout=20))  # after the outlier
        assert time.monotonic() - started < 20, err
        assert "xrun:   rank 2 (localhost, local 2): job.py:7 load_batch\n" in err  # the head's view, as for nodes
        [others] = [line for line in err.splitlines() if "ranks 0-1, 3: " in line]
        assert others.startswith("xrun:   ranks 0-1, 3: job.py:15 <module> > ")
        assert others.endswith("distributed_c10d.all_reduce")
        assert proc.poll() is None  # dump: the job goes on
        assert ("xrun[localhost]: preloaded torch in " in err) == bool(preload)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 130 and not processes_with_marker(f"XRUN_TEST_MARKER={marker}")


@needs_pyspy
@pytest.mark.slow
@pytest.mark.torch
def test_hang_action_stop_ends_with_its_code_and_leaves_no_process(tmp_path):
    pytest.importorskip("torch")
    # 12 s: four ranks importing torch on two loaded cores can be silent for 5 s before any of them is "up"
    proc, marker = start_xrun(tmp_path, "--num_gpus", "4", "--master_port", "0", "--hang_timeout", "12",
                              "--hang_action", "stop", "--log_dir", str(tmp_path / "logs"), script=GLOO)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == HANG_EXIT, err
    assert "stopped as hung: no rank on any node wrote output for 12 s (--hang_timeout); --hang_action stop" in err
    assert "    rank 2 (localhost, local 2): job.py:7 load_batch" in err.splitlines()  # in the report too
    failure = json.loads((tmp_path / "logs" / "localhost" / "failure.json").read_text())
    assert failure["exit_code"] == HANG_EXIT and failure["hang"] and len(failure["stacks"]) == 4
    assert not processes_with_marker(f"XRUN_TEST_MARKER={marker}")


# node 1 of a two-node world {"a": [0, 1], "localhost": [0, 1]}: its ranks are 2 and 3 of WORLD_SIZE 4
NODE_1_OF_2 = ["--world_info=eyJhIjogWzAsIDFdLCAibG9jYWxob3N0IjogWzAsIDFdfQ==", "--node_rank=1",
               "--master_addr=127.0.0.1"]


def test_a_stand_alone_agent_is_a_one_node_job_whose_head_restarts_its_hang_and_sums_it_up(tmp_path):
    """Issue 38 §1: ``python -m xrun.launch --world_info=...`` (DeepSpeed's per-node form, no head) runs through the
    head's control server and the node's driver as the local run: the head's doctor decides the hang, the head's
    ``Job`` restarts it (--hang_action restart, --max_restarts) and writes the job's summary.json with its attempts
    beside the node's own."""
    script = ("import os, time\nattempt = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
              "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'attempt', attempt, flush=True)\n"
              "time.sleep(60 if attempt == '0' else 0)\n")
    (tmp_path / "job.py").write_text(script)
    marker = f"xrun-stand-alone-{os.getpid()}-{time.monotonic_ns()}"
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "xrun.launch", *NODE_1_OF_2, "--master_port=29517",
                           f"--log_dir={logs}", "--hang_timeout=1.5", "--hang_action=restart", "--max_restarts=1",
                           "job.py"], cwd=tmp_path, env={**os.environ, "XRUN_TEST_MARKER": marker},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == sorted(f"[localhost:{rank}] rank {rank} of 4 attempt {attempt}"
                                                      for attempt in (0, 1) for rank in (2, 3))  # the world's
    # the head's doctor (a job's words, not the node's), then the head's restart
    assert "xrun: no rank on any node wrote output for 1.5 s (--hang_timeout): " in proc.stderr, proc.stderr
    assert "xrun: restarting the job: attempt 1 of 2" in proc.stderr, proc.stderr
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["exit_code"] == 0 and {"ranks", "end", "goodput", "events"} <= set(summary), summary
    first, last = summary["attempts"]
    assert "--hang_timeout" in first["root_cause"] and last["root_cause"] is None, summary["attempts"]
    assert sorted(r["rank"] for r in summary["ranks"]) == [2, 3]
    assert (logs / "localhost" / "rank2" / "stdout.log").exists()
    assert not processes_with_marker(f"XRUN_TEST_MARKER={marker}")


@needs_pyspy
@pytest.mark.slow
@pytest.mark.parametrize("flag", [None, "--no_failure_stacks"])
def test_the_survivors_stacks_are_in_the_failure_report(tmp_path, flag):
    flags = ["--num_gpus", "3", *([flag] if flag else [])]
    proc, _ = start_xrun(tmp_path, *flags, env={"FAIL_RANK": "1", "SLOW_RANK": "2"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    lines = err.splitlines()
    if flag:
        assert not any("taken before the stop" in line for line in lines)
        return
    at = lines.index("  stacks of 2 rank(s) taken before the stop, outliers first:")
    assert lines[at + 1 : at + 3] == ["    rank 0 (localhost, local 0): job.py:6 all_reduce",
                                      "    rank 2 (localhost, local 2): job.py:4 load_batch"]


@pytest.mark.slow
def test_without_py_spy_one_line_says_why_and_the_job_is_undisturbed(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    steady = "import os, time\nprint('up', os.environ['RANK'], flush=True)\ntime.sleep(2)\n"
    # an environment of its own without py-spy beside its python (xrun itself comes through PYTHONPATH: the folder
    # the installed package is in, since a venv made from a venv's python sees the base interpreter's packages), and
    # a PATH without one
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    installed = os.path.dirname(os.path.dirname(xrun.__file__))
    proc, _ = start_xrun(tmp_path, "--num_gpus", "2", "--hang_timeout", "1", script=steady,
                         env={"PATH": str(bin_dir), "PYTHONPATH": installed}, python=str(venv / "bin" / "python"))
    wait_for_lines(proc.stdout, 2, contains="up", timeout=30)
    proc.send_signal(signal.SIGQUIT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    why = [line for line in err.splitlines() if "py-spy is not installed" in line]
    assert why and set(why) == {"xrun: no stacks from localhost: py-spy is not installed there "
                                "(pip install py-spy, in the environment of the agent's python); the job goes on"}


@needs_pyspy
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_without_ptrace_permission_one_line_says_what_to_grant(tmp_path):
    """py-spy run as nobody against root's ranks: the kernel refuses, as in a container without SYS_PTRACE."""
    binary = tmp_path / "py-spy"
    shutil.copy(os.path.realpath(subprocess.run(["pyenv", "which", "py-spy"], capture_output=True, text=True)
                                 .stdout.strip() or shutil.which("py-spy")), binary)
    binary.chmod(0o755)
    tmp_path.chmod(0o755)
    wrapper = tmp_path / "unprivileged-py-spy"
    wrapper.write_text(f"#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {binary} \"$@\"\n")
    wrapper.chmod(0o755)
    steady = "import os, time\nprint('up', os.environ['RANK'], flush=True)\ntime.sleep(3)\n"
    proc, _ = start_xrun(tmp_path, "--num_gpus", "2", script=steady, env={"XRUN_PYSPY": str(wrapper)})
    wait_for_lines(proc.stdout, 2, contains="up", timeout=30)
    proc.send_signal(signal.SIGQUIT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    [line] = [line for line in err.splitlines() if "ranks 0-1: no stack" in line]
    assert "no permission to read the process" in line and "SYS_PTRACE" in line and "ptrace_scope" in line


# -- real processes: three agents over the control channel ---------------------------------------------------


def run_channel_job(tmp_path, *, options=AgentOptions(), env=None, during=None):
    script = tmp_path / "job.py"
    script.write_text(SLEEPER)
    if options.log_dir is None:  # the head's dump files go there, not into the test's working directory
        options = dataclasses.replace(options, log_dir=str(tmp_path / "logs"))
    request = JobRequest(script=str(script), master_port=0, launch=LaunchOptions(python=sys.executable),
                         env=env or {}, cwd=str(tmp_path), options=options)
    plan = make_plan(request, {"a": (0, 1), "b": (0,), "c": (0,)}, "ssh")
    server = head_server(plan, join_timeout=30, status=PlainStatus(3))
    port = server.listen(["127.0.0.1"])
    sessions = LocalSessions(plan, endpoint_of(server, port))
    if during:
        threading.Timer(during[0], during[1]).start()
    code = server.run(sessions)
    sessions.terminate()
    return code, {h: out.decode() for h, out in sessions.output.items()}


@needs_pyspy
@pytest.mark.slow
def test_sigquit_to_the_head_merges_every_node(tmp_path, capsys):
    code, _ = run_channel_job(
        tmp_path, env={"SLOW_RANK": "2"},
        during=(2.5, lambda: (os.kill(os.getpid(), signal.SIGQUIT), threading.Timer(
            4.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start())))
    assert code == 130
    err = capsys.readouterr().err.splitlines()
    assert "xrun:   rank 2 (b, local 0): job.py:4 load_batch" in err
    assert "xrun:   ranks 0-1, 3: job.py:6 all_reduce" in err


@needs_pyspy
@pytest.mark.slow
def test_hang_over_the_channel_stops_the_job_with_its_code(tmp_path, capsys):
    code, outputs = run_channel_job(tmp_path, options=AgentOptions(hang_timeout=3.0, hang_action=HangAction.STOP))
    assert code == HANG_EXIT
    err = capsys.readouterr().err
    assert "xrun:   rank 2 (b, local 0): job.py:4 load_batch" in err.splitlines()
    assert "job failed: no rank on any node wrote output for 3 s (--hang_timeout); --hang_action stop" in err


@needs_pyspy
@pytest.mark.slow
def test_a_failure_on_one_node_brings_every_nodes_stacks_into_the_reports(tmp_path, capsys):
    code, outputs = run_channel_job(tmp_path, env={"FAIL_RANK": "3", "SLOW_RANK": "2"})
    assert code == 3
    assert "    rank 2 (b, local 0): job.py:4 load_batch" in outputs["b"].splitlines()  # each node's own report
    assert "    ranks 0-1: job.py:6 all_reduce" in outputs["a"].splitlines()
    err = capsys.readouterr().err.splitlines()  # the head's: one view of the whole job
    at = err.index("xrun: stacks of 3 rank(s) taken before the stop, outliers first:")
    assert err[at + 1 : at + 3] == ["xrun:   rank 2 (b, local 0): job.py:4 load_batch",
                                    "xrun:   ranks 0-1: job.py:6 all_reduce"]


@needs_pyspy
@pytest.mark.slow
def test_pod_mode_sigquit_to_any_node_dumps_the_whole_job_at_node_0(tmp_path):

    pod = Pod(tmp_path, env={"SLEEP": "60"})
    for node in (0, 1, 2):
        pod.start(node)
    deadline = time.monotonic() + 30
    while len(processes_with_marker(pod.marker)) < 6 and time.monotonic() < deadline:
        time.sleep(0.1)  # three xruns and their three ranks
    time.sleep(0.5)  # each rank past its print, in its sleep
    pod.procs[1].send_signal(signal.SIGQUIT)
    time.sleep(3.0)
    pod.procs[0].send_signal(signal.SIGTERM)
    out = pod.finish(timeout=30)
    lines = out[0][2].splitlines()
    assert any("SIGQUIT at 127.0.0.2: stacks of 3 ranks, outliers first; full dumps in " in x for x in lines), lines
    assert "xrun:   ranks 0-2: train.py:5 <module>" in lines


@given(st.floats(0, 4e9, allow_nan=False))
def test_every_node_samples_its_ranks_at_the_same_wall_clock_moments(wall_now):
    """The straggler samples fall on multiples of SAMPLE_EVERY on the wall clock, half a period away at least
    (a timer a little early does not sample twice)."""
    wait = until_the_next_sample(wall_now)
    assert SAMPLE_EVERY / 2 <= wait <= SAMPLE_EVERY * 1.5
    moment = (wall_now + wait) / SAMPLE_EVERY
    assert abs(moment - round(moment)) < 1e-6
