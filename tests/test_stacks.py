"""Issue 13: third-party training stacks run under xrun unchanged and fast (real ranks, real files)."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_xrun
from tests.headserver import endpoint_of, head_server
from tests.test_control import LocalSessions
from xrun import __version__
from xrun.common.agent_cli import parse_agent_argv
from xrun.common.command import AgentCommand, agent_argv
from xrun.common.output.render import labelled
from xrun.common.output.status import PlainStatus
from xrun.common.output.streams import cut_lines
from xrun.common.rankplan import LaunchOptions, Rendezvous
from xrun.common.ranks import cpusets as cpusets_module
from xrun.common.ranks.binding import Cpu, Topology, plan_binding
from xrun.common.ranks.cpusets import gpu_nodes
from xrun.common.ranks.devices import (
    VISIBILITY,
    Devices,
    Vendor,
    detect_devices,
    gpu_numa_nodes,
    hides_devices,
    visible_devices,
)
from xrun.common.result.errorfile import RankError, parse_error, read_error_file
from xrun.common.result.hints import (
    ABORT_EXIT,
    IN_TEARDOWN,
    LOCAL_RANK_FIX,
    TEARDOWN_FIX,
    TERMINATE_LINE,
    aborted_in_teardown,
    failure_hint,
)
from xrun.common.spec import AgentOptions, ElasticOptions, NodeSpec, RankSpec, parse_rank_list, parse_signal_list
from xrun.errors import SelectionError, UnknownHostError, UsageError
from xrun.launch.elastic.run import attempt_result, failure_outcomes, waiting_line
from xrun.launch.ranks.processes import omp_threads, rank_environment
from xrun.runner.backends import local as local_backend
from xrun.runner.backends.routes import peer_address
from xrun.runner.check import assess
from xrun.runner.hosts.selection import Selection
from xrun.runner.hosts.this_machine import local_pool
from xrun.runner.job.events import Failure, Verdict
from xrun.runner.job.last_words import report_lines
from xrun.runner.plan import JobRequest, make_plan
from xrun.runner.remote_options import SshSettings

PRINT_OMP = "import os; print(os.environ.get('OMP_NUM_THREADS'))"


@pytest.mark.parametrize(
    ("env", "local_ranks", "cpus", "expected"),
    [
        ({}, 2, 16, {"OMP_NUM_THREADS": "8"}),
        ({}, 3, 16, {"OMP_NUM_THREADS": "5"}),
        ({}, 8, 2, {"OMP_NUM_THREADS": "1"}),  # never 0
        ({}, 1, 16, {}),  # one rank owns the node: the library's default is right
        ({"OMP_NUM_THREADS": "3"}, 4, 16, {}),  # the user's choice
        ({"OMP_NUM_THREADS": ""}, 4, 16, {}),  # set, even if empty
    ],
)
def test_omp_threads_table(env, local_ranks, cpus, expected):
    assert omp_threads(env, local_ranks, cpus) == expected


def test_omp_num_threads_shares_the_cpus_between_local_ranks(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # --no_dedupe: both ranks print the same line, and each must be seen (issue 17 shows it once by default)
    result = run_xrun("--num_gpus", "2", "--no_dedupe", "--no_python", "--no_local_rank", sys.executable, "-c",
                      PRINT_OMP)
    assert result.returncode == 0, result.stderr
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert sorted(result.stdout.splitlines()) == [f"[localhost:0] {share}", f"[localhost:1] {share}"]
    assert result.stderr.count(f"OMP_NUM_THREADS={share} for each of 2 ranks") == 1


def test_omp_num_threads_of_the_user_and_of_a_single_rank_are_kept(monkeypatch):
    # --no_dedupe: both ranks print the same line, and each must be seen (issue 17 shows it once by default)
    result = run_xrun("--num_gpus", "2", "--no_dedupe", "--no_python", "--no_local_rank", sys.executable, "-c",
                      PRINT_OMP, env={"OMP_NUM_THREADS": "3"})
    assert sorted(result.stdout.splitlines()) == ["[localhost:0] 3", "[localhost:1] 3"]
    assert "OMP_NUM_THREADS" not in result.stderr
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = run_xrun("--no_python", "--no_local_rank", sys.executable, "-c", PRINT_OMP)
    assert result.stdout == "[localhost:0] None\n"
    assert "OMP_NUM_THREADS" not in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# Item 2: TORCHELASTIC_ERROR_FILE and torch's @record.

RECORDED = (
    "import atexit, sys, time\n"
    "from torch.distributed.elastic.multiprocessing.errors import record\n"
    "import os\n"
    "atexit.register(lambda: print('atexit noise ' * 3, file=sys.stderr))\n"
    "def load(lr):\n"
    "    raise ValueError(f'bad learning rate {lr}')\n"
    "@record\n"
    "def main():\n"
    "    if os.environ['RANK'] == '1':\n"
    "        load(-1)\n"
    "    time.sleep(60)\n"
    "main()\n"
)


def test_parse_error_reads_torchs_format():
    stack = ('Traceback (most recent call last):\n  File "/a/t.py", line 9, in main\n    load(-1)\n'
             '  File "/a/t.py", line 6, in load\n    raise ValueError("x")\nValueError: bad: lr\n')
    data = {"message": {"message": "ValueError: bad: lr", "extraInfo": {"py_callstack": stack, "timestamp": "1"}}}
    assert parse_error(data) == RankError(
        "ValueError", "bad: lr",
        ('File "/a/t.py", line 9, in main: load(-1)', 'File "/a/t.py", line 6, in load: raise ValueError("x")'),
    )
    assert parse_error({"message": "a string"}) is None and parse_error([1]) is None
    assert parse_error({"message": {"message": "KeyboardInterrupt"}}) == RankError("KeyboardInterrupt", "")


def test_read_error_file_tolerates_missing_and_garbage(tmp_path):
    assert read_error_file(None) is None and read_error_file(str(tmp_path / "none.json")) is None
    (tmp_path / "bad.json").write_bytes(b"\xff{not json")
    assert read_error_file(str(tmp_path / "bad.json")) is None


def test_record_exception_is_the_root_cause_despite_atexit_noise(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(RECORDED)
    (tmp_path / "tmp").mkdir()
    result = run_xrun("--num_gpus", "2", "--no_local_rank", "--log_dir", str(tmp_path / "logs"), str(script),
                      env={"TMPDIR": str(tmp_path / "tmp")})
    assert result.returncode == 1, result.stderr
    report = result.stderr[result.stderr.index("xrun: node localhost:"):]
    assert "rank 1 raised ValueError: bad learning rate -1" in report
    assert 'in load: raise ValueError(f\'bad learning rate {lr}\')' in report
    assert report.index("raised ValueError") < report.index("atexit noise")
    failure = json.loads((tmp_path / "logs" / "localhost" / "failure.json").read_text())
    (root,) = [r for r in failure["ranks"] if r["root_cause"]]
    assert root["error"]["type"] == "ValueError" and root["error"]["message"] == "bad learning rate -1"
    assert root["error"]["frames"][-1].endswith("raise ValueError(f'bad learning rate {lr}')")
    assert os.listdir(tmp_path / "tmp") == []  # the per-run directory of error files is gone


def test_elastic_failures_read_the_error_file_torchs_agent_set(tmp_path):
    class Failure:  # torch's ProcessFailure: the agent gave the worker TORCHELASTIC_ERROR_FILE=error_file
        def __init__(self, error_file):
            self.pid, self.exitcode, self.timestamp, self.error_file = 11, 1, 100, error_file

    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": {"message": "RuntimeError: NCCL timeout",
                                            "extraInfo": {"py_callstack": "", "timestamp": "1"}}}))
    found = failure_outcomes("h", {0: 4, 1: 5}, {0: 10, 1: 11}, {5: Failure(str(path))}, {}, 2.0, stopped_all=False)
    root = attempt_result("h", found, None).root_cause
    assert root.error == RankError("RuntimeError", "NCCL timeout")


@pytest.mark.slow
def test_elastic_record_exception_is_the_root_cause(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(RECORDED)
    result = run_xrun("--elastic", "--num_gpus", "2", "--no_local_rank", str(script), timeout=120)
    assert result.returncode == 1, result.stderr
    report = result.stderr[result.stderr.index("xrun: node localhost:"):]
    assert "rank 1 raised ValueError: bad learning rate -1" in report


# ---------------------------------------------------------------------------------------------------------------
# Item 3: scripts that reject --local_rank.


@pytest.mark.parametrize(
    "line",
    [
        "train.py: error: unrecognized arguments: --local_rank=0",  # argparse, hydra
        "error: Unrecognized arguments: --local_rank=1",  # LightningCLI (jsonargparse)
        "Error: No such option: --local_rank",  # click
        "Error: No such option '--local_rank'.",  # click 8.2
    ],
)
def test_failure_hint_names_the_fix(line):
    assert failure_hint(2, ["Traceback:", line]) == LOCAL_RANK_FIX
    assert "rerun with --no_local_rank" in LOCAL_RANK_FIX


def test_failure_hint_ignores_other_errors():
    assert failure_hint(2, ["error: unrecognized arguments: --lr=3", "ValueError: --local_rank is 9"]) is None


def test_script_rejecting_local_rank_ends_the_report_with_the_fix(tmp_path):
    script = tmp_path / "strict.py"
    script.write_text("import argparse\nargparse.ArgumentParser().parse_args()\nprint('ran')\n")
    result = run_xrun("--num_gpus", "2", str(script))
    assert result.returncode == 2, result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == f"xrun: node localhost: {LOCAL_RANK_FIX}"
    # --no_dedupe: both ranks print the same line, and each must be seen (issue 17 shows it once by default)
    result = run_xrun("--num_gpus", "2", "--no_dedupe", "--no_local_rank", str(script))
    assert result.returncode == 0 and result.stdout.count("ran") == 2


def test_head_report_of_a_multi_node_job_ends_with_the_fix():
    failure = Failure("node1", "rank 3 exited with code 2", 2, rank=3, tail=("x: error: unrecognized arguments: "
                                                                            "--local_rank=1",))
    lines = report_lines(Verdict(exit_code=2, failure=failure))
    assert lines[-1] == LOCAL_RANK_FIX and lines[-2].startswith("  [node1:3] ")


# ---------------------------------------------------------------------------------------------------------------
# Issue 33 §5: a rank that aborts in teardown after its last line (torch 2.13's gloo, now and then) is named so.

TEARDOWN_ABORT = os.path.join(ROOT, "tests", "procs", "gloo_teardown_abort.py")  # the signature, every time (its doc says how)
BAR = "100%|##########| 2/2 [00:00<00:00, 48.60it/s]"  # a progress bar's last redraw, without an end of its own


@pytest.mark.parametrize(
    "code, tail, teardown",
    [
        (ABORT_EXIT, ["{'train_loss': 1.38}", TERMINATE_LINE], True),
        (ABORT_EXIT, [f"{BAR}{TERMINATE_LINE}", ""], True),  # the bar's line and the terminate line as one
        (1, ["done", TERMINATE_LINE], False),  # not SIGABRT: something else ended it
        (ABORT_EXIT, ["Traceback (most recent call last):", "RuntimeError: x", TERMINATE_LINE], False),  # mid-run
        (ABORT_EXIT, [TERMINATE_LINE, "free(): invalid pointer"], False),  # something after it: not that abort
        (ABORT_EXIT, ["done"], False),  # an abort() of another kind
        (ABORT_EXIT, [], False),
    ],
)
def test_aborted_in_teardown_is_a_sigabrt_whose_tail_ends_with_the_terminate_line(code, tail, teardown):
    assert aborted_in_teardown(code, tail) is teardown
    assert failure_hint(code, tail) == (TEARDOWN_FIX if teardown else None)
    assert "destroy_process_group()" in TEARDOWN_FIX


def test_a_rank_that_aborts_after_its_last_line_is_named_so_with_the_fix():
    result = run_xrun("--num_gpus", "2", "--no_local_rank", TEARDOWN_ABORT)
    assert result.returncode == ABORT_EXIT, result.stderr
    assert "[localhost:0] rank 0 done" in result.stdout.splitlines()
    # "failed first" if rank 1 was still running and was stopped, "failed" if it had ended well
    headline = next(line for line in result.stderr.splitlines() if "rank 0 failed" in line)
    assert re.search(r"rank 0 failed( first)?: signal SIGABRT \(6\) after ", headline), headline
    assert headline.endswith(f", {IN_TEARDOWN} (exit code 134)"), headline
    assert result.stderr.rstrip().splitlines()[-1] == f"xrun: node localhost: {TEARDOWN_FIX}"


def test_the_heads_report_names_an_abort_in_teardown_with_the_fix(capfd):
    request = JobRequest(script=TEARDOWN_ABORT, master_port=0, launch=LaunchOptions(python=sys.executable,
                         local_rank_arg=False), cwd=ROOT)  # fmt: skip
    plan = make_plan(request, {"a": (0,), "b": (0,)}, "ssh")
    server = head_server(plan, join_timeout=30, status=PlainStatus(2))
    sessions = LocalSessions(plan, endpoint_of(server, server.listen(["127.0.0.1"])))
    code = server.run(sessions)
    sessions.terminate()
    err = capfd.readouterr().err
    assert code == ABORT_EXIT, (err, sessions.output)
    assert f"job failed: rank 0 (local 0) on a was killed by SIGABRT {IN_TEARDOWN}" in err
    assert f"xrun: {TEARDOWN_FIX}" in err.splitlines()  # after the tail, before the table


# ---------------------------------------------------------------------------------------------------------------
# Item 4: progress bars stay live on the console.


@pytest.mark.parametrize(
    ("pending", "chunk", "out", "rest"),
    [
        (b"", b"\r 10%\r 20%", b"[p] \r[p]  10%\r", b" 20%"),  # tqdm: "\r" before each update
        (b"", b"10%\r20%\r", b"[p] 10%\r", b"20%\r"),  # a final "\r" waits: it may start "\r\n"
        (b"20%\r", b"\ndone\n", b"[p] 20%\r\n[p] done\n", b""),  # ...and here it did
        (b"", b"a\rb\r\nc\n", b"[p] a\r[p] b\r\n[p] c\n", b""),
        (b"", b"\r\r\n\n", b"[p] \r[p] \r\n[p] \n", b""),
        (b"", b"no boundary\r", b"", b"no boundary\r"),
    ],
)
def test_carriage_return_ends_a_console_line(pending, chunk, out, rest):
    done, left = cut_lines(pending, chunk)  # the node cuts its ranks' lines; the head labels them
    assert (labelled(b"[p] ", done), left) == (out, rest)


BAR = (
    "import os, sys, time\n"
    "for step in (1, 2, 3):\n"
    "    sys.stdout.write(f'\\rstep {step}'); sys.stdout.flush()\n"
    "deadline = time.monotonic() + 30\n"
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.01)\n"
    "print()\n"
)


def test_progress_bar_is_live_on_the_console_and_raw_in_the_log(tmp_path):
    script, go, logs = tmp_path / "bar.py", tmp_path / "go", tmp_path / "logs"
    script.write_text(BAR)
    proc = subprocess.Popen([sys.executable, "-m", "xrun", "--no_local_rank", "--log_dir", str(logs), str(script),
                             str(go)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = b""
        while b"step 2\r" not in seen:  # before the rank ends: the updates reach the console as they come
            byte = proc.stdout.read(1)
            assert byte, seen
            seen += byte
        go.touch()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    assert seen + out == b"[localhost:0] \r[localhost:0] step 1\r[localhost:0] step 2\r[localhost:0] step 3\n"
    assert (logs / "localhost" / "rank0" / "stdout.log").read_bytes() == b"\rstep 1\rstep 2\rstep 3\n"


# ---------------------------------------------------------------------------------------------------------------
# Item 5: --console_ranks.


@pytest.mark.parametrize(("text", "ranks"), [("0", (0,)), ("0,2-3", (0, 2, 3)), ("3-3, 1", (1, 3)), ("1,1", (1,))])
def test_parse_rank_list(text, ranks):
    assert parse_rank_list("--console_ranks", text) == ranks


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "'': '' is not a rank or a low-high range; e.g. 0 or 0,2-3"),
        ("a", "'a': 'a' is not a rank or a low-high range; e.g. 0 or 0,2-3"),
        ("-1", "'-1': '-1' is not a rank or a low-high range; e.g. 0 or 0,2-3"),
        ("0,", "'0,': '' is not a rank or a low-high range; e.g. 0 or 0,2-3"),
        ("3-1", "'3-1': range 3-1 runs backwards (write 1-3)"),
    ],
)
def test_parse_rank_list_refuses(text, reason):
    with pytest.raises(UsageError) as err:
        parse_rank_list("--console_ranks", text)
    assert str(err.value) == f"--console_ranks: {reason}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--console_ranks", "1-x"], "xrun: --console_ranks: '1-x': '1-x' is not a rank or a low-high range; "
                                     "e.g. 0 or 0,2-3"),
        (["--console_ranks", "2"], "xrun: --console_ranks: rank 2 does not exist: the job has ranks 0-1"),
    ],
)
def test_console_ranks_refused_with_one_line_and_exit_2(args, message):
    result = run_xrun("--num_gpus", "2", *args, "x.py")
    assert (result.returncode, result.stderr, result.stdout) == (2, message + "\n", "")


def test_console_ranks_filters_the_console_but_not_the_logs_nor_the_report(tmp_path):
    script, logs = tmp_path / "talk.py", tmp_path / "logs"
    said = tmp_path / "said"
    said.mkdir()
    script.write_text(  # rank 2 fails only once ranks 0 and 1 have spoken: its failure stops them
        "import os, sys, time\n"
        "rank = os.environ['RANK']\n"
        "print('out', rank); print('err', rank, file=sys.stderr)\n"
        f"open(os.path.join({str(said)!r}, rank), 'w').close()\n"
        f"while rank == '2' and len(os.listdir({str(said)!r})) < 3: time.sleep(0.01)\n"
        "sys.exit(5 if rank == '2' else 0)\n"
    )
    result = run_xrun("--num_gpus", "3", "--no_local_rank", "--console_ranks", "0-1", "--log_dir", str(logs),
                      str(script))
    assert result.returncode == 5
    assert sorted(result.stdout.splitlines()) == ["[localhost:0] out 0", "[localhost:1] out 1"]
    assert "[localhost:2]" not in result.stderr
    assert "    | err 2" in result.stderr  # the failing rank's tail still reaches the report
    assert (logs / "localhost" / "rank2" / "stdout.log").read_text() == "out 2\n"


def test_console_ranks_travel_in_the_agent_command_and_the_node_spec():
    options = AgentOptions(console_ranks=(0, 2, 3))
    assert NodeSpec.from_json(NodeSpec("h", 0, (), options=options).to_json()).options == options
    assert "console_ranks" not in NodeSpec("h", 0, ()).to_json()["options"]  # unchanged spec (and digest) without it
    command = AgentCommand(world={"h": (0,)}, node_rank=0, rendezvous=Rendezvous("a", 1), launch=LaunchOptions(),
                           options=options, script="t.py", args=())
    argv = agent_argv(command)
    assert "--console_ranks=0,2,3" in argv
    assert parse_agent_argv(argv[4:]).options == options


# ---------------------------------------------------------------------------------------------------------------
# Item 6: signal forwarding.

RECORD_SIGNAL = (
    "import os, signal, sys, time\n"
    "directory, rank, got = sys.argv[1], os.environ['RANK'], []\n"
    "for sig in (signal.SIGUSR1, signal.SIGUSR2):\n"
    "    signal.signal(sig, lambda n, f: got.append(n))\n"
    "open(os.path.join(directory, 'ready' + rank), 'w').close()\n"
    "deadline = time.monotonic() + 30\n"
    "while not got and time.monotonic() < deadline:\n"
    "    time.sleep(0.01)\n"
    "time.sleep(0.3)  # a second signal would arrive now\n"
    "with open(os.path.join(directory, 'got' + rank), 'w') as f:\n"
    "    f.write(','.join(signal.Signals(n).name for n in got))\n"
)


def wait_for_files(directory, names, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not all((directory / n).exists() for n in names):
        assert time.monotonic() < deadline, sorted(os.listdir(directory))
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("text", "signals"),
    [("", ()), ("USR1", (signal.SIGUSR1,)), ("sigusr2, WINCH,USR2", (signal.SIGUSR2, signal.SIGWINCH))],
)
def test_parse_signal_list(text, signals):
    assert parse_signal_list("--forward_signals", text) == signals


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("USR3", "'USR3': 'USR3' is not a signal name; e.g. USR1,USR2 (empty: none)"),
        ("TERM", "'TERM': SIGTERM cannot be forwarded (it is uncatchable, or xrun's own)"),
        ("USR1,KILL", "'USR1,KILL': SIGKILL cannot be forwarded (it is uncatchable, or xrun's own)"),
        ("QUIT", "'QUIT': SIGQUIT cannot be forwarded (it is uncatchable, or xrun's own)"),  # the hang doctor's key
    ],
)
def test_forward_signals_refused(text, reason):
    with pytest.raises(UsageError) as err:
        parse_signal_list("--forward_signals", text)
    assert str(err.value) == f"--forward_signals: {reason}"
    result = run_xrun("--forward_signals", text, "x.py")
    assert (result.returncode, result.stderr) == (2, f"xrun: --forward_signals: {reason}\n")


def test_forward_signals_travel_in_the_agent_command_and_the_node_spec():
    for signals in ((), (signal.SIGUSR2,)):
        options = AgentOptions(forward_signals=signals)
        assert NodeSpec.from_json(NodeSpec("h", 0, (), options=options).to_json()).options == options
        command = AgentCommand(world={"h": (0,)}, node_rank=0, rendezvous=Rendezvous("a", 1),
                               launch=LaunchOptions(), options=options, script="t.py", args=())
        assert parse_agent_argv(agent_argv(command)[4:]).options == options
    assert "forward_signals" not in NodeSpec("h", 0, ()).to_json()["options"]  # default: spec (and digest) unchanged


@pytest.mark.parametrize(("flags", "sig"), [((), signal.SIGUSR1), (("--forward_signals", "USR2"), signal.SIGUSR2)])
def test_local_signal_reaches_every_rank_and_the_job_goes_on(tmp_path, flags, sig):
    script = tmp_path / "rec.py"
    script.write_text(RECORD_SIGNAL)
    proc = subprocess.Popen([sys.executable, "-m", "xrun", "--num_gpus", "2", "--no_local_rank", *flags, str(script),
                             str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_files(tmp_path, ["ready0", "ready1"])
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert [(tmp_path / f"got{r}").read_text() for r in (0, 1)] == [sig.name, sig.name]
    assert f"forwarded {sig.name} to 2 ranks" in err


def test_signal_to_the_head_reaches_every_rank_on_every_node(tmp_path):
    script = tmp_path / "rec.py"
    script.write_text(RECORD_SIGNAL)
    request = JobRequest(script=str(script), args=(str(tmp_path),), launch=LaunchOptions(python=sys.executable,
                         local_rank_arg=False), cwd=str(tmp_path))  # fmt: skip
    plan = make_plan(request, {"a": (0, 1), "b": (0,)}, "ssh")
    server = head_server(plan, join_timeout=30, status=PlainStatus(2))
    port = server.listen(["127.0.0.1"])
    sessions = LocalSessions(plan, endpoint_of(server, port))

    def signal_when_ready():
        wait_for_files(tmp_path, ["ready0", "ready1", "ready2"])
        os.kill(os.getpid(), signal.SIGUSR1)  # the server's handler is installed while it runs

    threading.Thread(target=signal_when_ready, daemon=True).start()
    code = server.run(sessions)
    sessions.terminate()
    assert code == 0, sessions.output
    assert [(tmp_path / f"got{r}").read_text() for r in (0, 1, 2)] == ["SIGUSR1"] * 3


# ---------------------------------------------------------------------------------------------------------------
# Item 7 (part): CUDA_VISIBLE_DEVICES=-1 or empty means CPU slots.


@pytest.mark.parametrize(("visible", "hidden"), [("", True), ("-1", True), ("-1,0", True), ("0", False),
                                                 ("2,3", False), ("GPU-1234", False)])  # fmt: skip
def test_hides_devices(visible, hidden):
    assert hides_devices(visible) is hidden


@pytest.mark.parametrize("visible", ["-1", ""])
def test_hidden_gpus_mean_cpu_slots(visible):
    assert local_pool({"CUDA_VISIBLE_DEVICES": visible}, Selection(num_gpus=3), detect=lambda: 8).pool == {
        "localhost": (0, 1, 2)
    }
    assert local_pool({"CUDA_VISIBLE_DEVICES": visible}, Selection(), detect=lambda: 8).pool == {"localhost": (0,)}


def test_hidden_gpus_stay_hidden_from_every_rank():
    script = "import os; print(os.environ['RANK'], repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    result = run_xrun("--num_gpus", "2", "--no_python", "--no_local_rank", sys.executable, "-c", script,
                      env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[localhost:0] 0 '-1'", "[localhost:1] 1 '-1'"]


# ---------------------------------------------------------------------------------------------------------------
# Item 7: devices beyond NVIDIA indices (literal /proc, /sys and /dev trees).

UUID_A = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
UUID_B = "GPU-1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718"
MIG_A = "MIG-4d5e6f70-8192-a3b4-c5d6-e7f809112233"


def make_tree(root, files):
    for path, text in files.items():
        full = root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)
    return str(root)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, None),
        ({"proc/driver/nvidia/gpus/0000:01:00.0/information": "", "proc/driver/nvidia/gpus/0000:02:00.0/information": ""},
         Devices(Vendor.NVIDIA, 2)),
        ({"sys/class/kfd/kfd/topology/nodes/0/properties": "cpu_cores_count 64\nsimd_count 0\n",
          "sys/class/kfd/kfd/topology/nodes/1/properties": "cpu_cores_count 0\nsimd_count 304\n",
          "sys/class/kfd/kfd/topology/nodes/2/properties": "simd_count 304\n"}, Devices(Vendor.AMD, 2)),
        ({"sys/class/drm/card0/device/vendor": "0x8086\n", "sys/class/drm/card0/device/device": "0x0bd5\n",
          "sys/class/drm/card1/device/vendor": "0x8086\n", "sys/class/drm/card1/device/device": "0x9a49\n",  # an iGPU
          "sys/class/drm/renderD128/device/vendor": "0x8086\n"}, Devices(Vendor.INTEL, 1)),
        ({"sys/class/drm/card0/device/vendor": "0x8086\n", "sys/class/drm/card0/device/device": "0x9a49\n"}, None),
        ({f"sys/class/accel/accel{i}/device/vendor": "0x1da3\n" for i in range(8)}, Devices(Vendor.GAUDI, 8)),
        ({"dev/davinci0": "", "dev/davinci1": "", "dev/davinci_manager": "", "dev/devmm_svm": ""},
         Devices(Vendor.ASCEND, 2)),
    ],
)
def test_detect_devices_from_literal_trees(tmp_path, files, expected):
    assert detect_devices(make_tree(tmp_path, files)) == expected


@pytest.mark.parametrize(
    ("inherited", "planned", "expected"),
    [
        (None, "0,1", "0,1"),
        ("2,3", "2,3", "2,3"),
        ("-1", "0,1", "-1"),
        ("", "0", ""),
        (f"{UUID_A},{UUID_B}", "0,1", f"{UUID_A},{UUID_B}"),
        (f"{UUID_A},{UUID_B}", "1", UUID_B),
        (f"{MIG_A},MIG-GPU-{UUID_A[4:]}/1/0", "0,1", f"{MIG_A},MIG-GPU-{UUID_A[4:]}/1/0"),
    ],
)
def test_visible_devices(inherited, planned, expected):
    assert visible_devices(inherited, planned) == expected


def test_visible_devices_refuses_a_slot_past_the_names():
    with pytest.raises(UsageError, match="lists 1 device"):
        visible_devices(UUID_A, "0,1")


@pytest.mark.parametrize(
    ("env", "selection", "expected"),
    [
        ({"CUDA_VISIBLE_DEVICES": f"{UUID_A}, {UUID_B}"}, Selection(), (0, 1)),
        ({"CUDA_VISIBLE_DEVICES": MIG_A}, Selection(), (0,)),
        ({"HIP_VISIBLE_DEVICES": "2,3"}, Selection(), (2, 3)),
        ({"ASCEND_RT_VISIBLE_DEVICES": "-1"}, Selection(num_gpus=2), (0, 1)),
    ],
)
def test_local_pool_device_names_and_other_vendors(env, selection, expected):
    assert local_pool(env, selection, detect=lambda: 8).pool == {"localhost": expected}


def test_local_pool_refuses_a_name_twice():
    with pytest.raises(SelectionError, match="lists a device twice"):
        local_pool({"CUDA_VISIBLE_DEVICES": f"{UUID_A},{UUID_A}"}, Selection(), detect=lambda: 2)


@pytest.mark.parametrize(
    ("devices", "base", "expected"),
    [
        (None, {}, {"CUDA_VISIBLE_DEVICES": "0,1"}),
        (Devices(Vendor.AMD, 2), {}, {"HIP_VISIBLE_DEVICES": "0,1"}),
        (Devices(Vendor.GAUDI, 8), {}, {"HABANA_VISIBLE_MODULES": "0,1"}),
        (Devices(Vendor.AMD, 2), {"HIP_VISIBLE_DEVICES": "-1"}, {"HIP_VISIBLE_DEVICES": "-1",
                                                                  "CUDA_VISIBLE_DEVICES": "-1"}),
        (Devices(Vendor.NVIDIA, 2), {"CUDA_VISIBLE_DEVICES": f"{UUID_B},{UUID_A}"},
         {"CUDA_VISIBLE_DEVICES": f"{UUID_B},{UUID_A}"}),
    ],
)
def test_rank_environment_says_the_slots_the_nodes_way(devices, base, expected):
    rank = RankSpec(rank=0, local_rank=0, env={"CUDA_VISIBLE_DEVICES": "0,1", "RANK": "0"}, argv=("x",))
    env = rank_environment(base, NodeSpec("h", 0, (rank,)), rank, devices)
    assert {k: v for k, v in env.items() if k in VISIBILITY.values()} == expected


def test_uuid_slot_names_reach_the_ranks():
    script = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    # --no_dedupe: both ranks print the same line, and each must be seen (issue 17 shows it once by default)
    result = run_xrun("--no_dedupe", "--no_python", "--no_local_rank", sys.executable, "-c", script,
                      env={"CUDA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"})
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"[localhost:{r}] {UUID_A},{UUID_B}" for r in (0, 1)]
    result = run_xrun("--num_gpus", "1", "--no_python", "--no_local_rank", sys.executable, "-c", script,
                      env={"CUDA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"})
    assert result.stdout == f"[localhost:0] {UUID_A}\n", result.stderr


def test_device_per_rank_shows_each_rank_only_its_own_device(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import os, sys\n"
                      "print(os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['CUDA_VISIBLE_DEVICES'], sys.argv[1:])\n")
    result = run_xrun("--device_per_rank", str(script), env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[localhost:0] 0 0 2 ['--local_rank=0']",
                                                  "[localhost:1] 1 0 3 ['--local_rank=0']"]
    refused = run_xrun("--device_per_rank", "--elastic", "x.py")
    assert (refused.returncode, refused.stderr) == (
        2, "xrun: --device_per_rank: does not apply with --elastic (torch's agent sets LOCAL_RANK)\n")


def test_device_per_rank_travels_in_the_agent_command():
    command = AgentCommand(world={"h": (0, 1)}, node_rank=0, rendezvous=Rendezvous("a", 1),
                           launch=LaunchOptions(device_per_rank=True), options=AgentOptions(), script="t.py", args=())
    assert "--device_per_rank" in agent_argv(command)
    assert parse_agent_argv(agent_argv(command)[4:]).launch == command.launch


# ---------------------------------------------------------------------------------------------------------------
# Item 8: cores near each rank's GPU.

# Two sockets, 4 cores each without SMT: node 0 = CPUs 0-3, node 1 = CPUs 4-7.
TWO_NODES = Topology(tuple(Cpu(i, i // 4, i % 4, i // 4) for i in range(8)))


@pytest.mark.parametrize(
    ("gpu_nodes", "expected"),
    [
        ((1, 1, 0, 0), [(4, 5), (6, 7), (0, 1), (2, 3)]),  # GPUs 0-1 sit on socket 1
        ((1, 0), [(4, 5, 6, 7), (0, 1, 2, 3)]),
        ((0, 0, 0, 1), [(0,), (1,), (2,), (4,)]),  # equal shares: the crowded node decides the size
        ((None, 0), [(0, 1, 2, 3), (4, 5, 6, 7)]),  # a node unknown: the even split
        (None, [(0, 1), (2, 3), (4, 5), (6, 7)]),
    ],
)
def test_gpu_near_binding(gpu_nodes, expected):
    n = len(expected)
    bindings = plan_binding(TWO_NODES, n, frozenset(range(8)), gpu_nodes=gpu_nodes)
    assert [b.cpus for b in bindings] == expected


def test_gpu_near_binding_falls_back_when_a_node_is_too_small():
    bindings = plan_binding(TWO_NODES, 5, frozenset(range(8)), gpu_nodes=(0, 0, 0, 0, 0))
    assert [b.cpus for b in bindings] == [(0,), (1,), (2,), (3,), (4,)]


def gpu_tree(tmp_path, nodes):
    files = {}
    for i, node in enumerate(nodes):
        bus = f"0000:{0x10 * (i + 1):02x}:00.0"
        files[f"proc/driver/nvidia/gpus/{bus}/information"] = f"Device Minor: {i}\n"
        files[f"sys/bus/pci/devices/{bus}/numa_node"] = f"{node}\n"
    return make_tree(tmp_path, files)


def test_gpu_numa_nodes_from_a_literal_tree(tmp_path):
    assert gpu_numa_nodes(gpu_tree(tmp_path, [1, 1, 0, -1])) == {0: 1, 1: 1, 2: 0}


def test_rank_gpu_nodes_follow_each_ranks_slot(tmp_path):
    root = gpu_tree(tmp_path, [0, 0, 1, 1])
    ranks = tuple(RankSpec(r, r, {"CUDA_VISIBLE_DEVICES": "2,3"}, ("x",)) for r in range(2))
    spec = NodeSpec("h", 0, ranks)
    assert gpu_nodes(spec, {"CUDA_VISIBLE_DEVICES": "2,3"}, root) == (1, 1)
    assert gpu_nodes(spec, {"CUDA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"}, root) is None
    one_each = tuple(RankSpec(r, r, {"CUDA_VISIBLE_DEVICES": str(r + 1)}, ("x",)) for r in range(2))  # per rank
    assert gpu_nodes(NodeSpec("h", 0, one_each), {}, root) == (0, 1)
    assert gpu_nodes(spec, {}, str(tmp_path / "nothing")) is None


def test_dry_run_says_the_cpus_are_near_the_gpu(monkeypatch, tmp_path):
    root = gpu_tree(tmp_path, [1, 0])
    monkeypatch.setattr(local_backend, "gpu_nodes", lambda node, env: gpu_nodes(node, env, root))
    monkeypatch.setattr(cpusets_module, "gpu_nodes", lambda spec, env: gpu_nodes(spec, env, root))
    monkeypatch.setattr("xrun.common.ranks.binding.read_topology", lambda: TWO_NODES)  # imported when binding
    monkeypatch.setattr(cpusets_module.os, "sched_getaffinity", lambda pid: set(range(8)))
    ranks = tuple(RankSpec(r, r, {"CUDA_VISIBLE_DEVICES": "0,1"}, ("x",)) for r in range(2))
    node = NodeSpec("localhost", 0, ranks, options=AgentOptions(bind_cores=True))
    assert local_backend.local_cpu_sets(node) == {0: "4-7, near its GPU on NUMA node 1",
                                                  1: "0-3, near its GPU on NUMA node 0"}


# ---------------------------------------------------------------------------------------------------------------
# Item 9: newcomer friction.


def test_check_without_a_hostfile_checks_this_machine_without_ssh():
    result = run_xrun("check", env={"PATH": os.path.dirname(sys.executable)})  # no ssh, no pdsh on this PATH
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].startswith("localhost  yes")
    assert "1 host(s) reachable and consistent" in result.stdout


def test_check_names_the_fix_when_a_nodes_python_has_no_xrun():
    # the probe is python -m xrun.launch.check_probe: an interpreter without xrun cannot run it
    error = ("/usr/bin/python3: Error while finding module specification for 'xrun.launch.check_probe' "
             "(ModuleNotFoundError: No module named 'xrun')")
    [report] = assess({"a": (0,)}, {"a": (True, "", error)}, 0)
    assert report.problems == [f"the probe did not run: {error}; install xrun {__version__} there"]


def test_an_unresolvable_host_is_named_not_a_flag():
    with pytest.raises(UnknownHostError) as err:
        peer_address("no-such-node.invalid", SshSettings())
    assert err.value.host == "no-such-node.invalid"
    assert str(err.value).startswith("host 'no-such-node.invalid': does not resolve")
    assert "--control_addr:" not in str(err.value)


def test_export_on_a_local_run_is_set_and_checked():
    script = "import os; print(os.environ['XRUN_T1'], os.environ['XRUN_T2'])"
    result = run_xrun("--export", "XRUN_T1=a b", "--export", "XRUN_T2", "--no_python", "--no_local_rank",
                      sys.executable, "-c", script, env={"XRUN_T2": "from here"})
    assert (result.returncode, result.stdout) == (0, "[localhost:0] a b from here\n"), result.stderr
    refused = run_xrun("--export", "A B=1", "x.py")
    assert (refused.returncode, refused.stderr) == (
        2, "xrun: --export: 'A B=1': expected NAME or NAME=VALUE with a variable name\n")


@pytest.mark.parametrize(
    ("nnodes", "expected"),
    [
        ((2, 2), "rendezvous: waiting for all 2 node(s) to join"),
        ((1, 2), "rendezvous: waiting for 1 to 2 nodes; once 1 joined it waits 30 s more (last_call_timeout) for "
                 "the others, then starts"),
    ],
)
def test_elastic_says_what_the_rendezvous_waits_for(nnodes, expected):
    options = ElasticOptions(min_nodes=nnodes[0], max_nodes=nnodes[1], rdzv_endpoint="h:1", rdzv_id="x")
    assert waiting_line(options, 0) == expected


def test_test_extras_bring_numpy_so_torch_ranks_do_not_warn():
    setup = (Path(ROOT) / "setup.py").read_text()
    assert '"numpy>=1.24"' in setup.split("TEST = ", 1)[1].split("\n", 1)[0]


@pytest.mark.slow
def test_elastic_signal_reaches_every_worker_and_the_job_goes_on(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "rec.py"
    script.write_text(RECORD_SIGNAL)
    proc = subprocess.Popen([sys.executable, "-m", "xrun", "--elastic", "--num_gpus", "2", "--no_local_rank",
                             str(script), str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for_files(tmp_path, ["ready0", "ready1"], timeout=60)
        proc.send_signal(signal.SIGUSR2)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert [(tmp_path / f"got{r}").read_text() for r in (0, 1)] == ["SIGUSR2", "SIGUSR2"]
    assert "forwarded SIGUSR2 to 2 ranks" in err
