"""``xrun --preload`` end to end (issue 32): the flag and ``$XRUN_PRELOAD``, their refusals (one line, exit code 2,
the dry run alike), ranks forked from one helper for every attempt, core binding of forked ranks, and the faults:
the helper killed during a run and between attempts, a rank forked while the helper is killed, ``kill -9`` of xrun.

The ranks are tests/procs/preload_rank.py; the preloaded module tests/procs/preload_mark.py remembers the pid that
imported it, so a rank says whether it was forked from the helper (the helper's pid) and from which one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.cluster.harness import processes_with_marker
from tests.conftest import ROOT, run_xrun
from xrun.common.agent_cli import build_parser, parse_agent_argv, preload_option
from xrun.common.command import agent_argv
from xrun.common.preload.find import check_findable
from xrun.common.spec import AgentOptions, NodeSpec, parse_module_list
from xrun.errors import PreloadError, UsageError
from xrun.launch.procs import proctable
from xrun.launch.telemetry.endpoints import SITE_DIR, SOCKET_VARIABLE

PROCS = os.path.join(ROOT, "tests", "procs")
RANK = os.path.join(PROCS, "preload_rank.py")
WAIT = 60.0


def reports(stdout: str) -> list[dict]:
    return [json.loads(line.split("] ", 1)[1]) for line in stdout.splitlines() if '] {"rank"' in line]


def helper_pid(stderr: str) -> int:
    found = re.search(r"preloaded \S+ in [0-9.]+ s; the ranks are forked from the helper \(pid (\d+)\)", stderr)
    assert found, stderr
    return int(found.group(1))


# -- the flag, the variable, the spec --------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "says"), [
    ("", "names no module"),
    ("torch, numpy", "no spaces; separate the modules with commas only"),
    ("torch,", "'' is not a module name"),
    ("./models.py", "'./models.py' is a path or a file name, not a module name"),
    ("/opt/lib/torch", "is a path or a file name"),
    ("models.py", "is a path or a file name"),
    ("torch..nn", "'torch..nn' is not a module name"),
    ("1torch", "is not a module name"),
])
def test_a_module_list_that_names_no_module_is_refused_in_one_line(text, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        parse_module_list("--preload", text)


def test_a_module_list_keeps_its_order_and_drops_repeats():
    assert parse_module_list("--preload", "torch,transformers,torch.nn,torch") == ("torch", "transformers", "torch.nn")


def _ns(*flags: str):
    return build_parser().parse_args(["--world_info=e30=", "--node_rank=0", *flags])


def test_the_flag_wins_over_the_variable_and_an_empty_variable_is_none():
    assert preload_option(_ns("--preload=json"), "t.py", {"XRUN_PRELOAD": "torch"}) == ("json",)
    assert preload_option(_ns(), "t.py", {"XRUN_PRELOAD": "torch,numpy"}) == ("torch", "numpy")
    assert preload_option(_ns(), "t.py", {"XRUN_PRELOAD": ""}) == ()
    with pytest.raises(UsageError, match="XRUN_PRELOAD: 'a b': no spaces"):
        preload_option(_ns(), "t.py", {"XRUN_PRELOAD": "a b"})


@pytest.mark.parametrize(("flags", "script", "why"), [
    (("--no_python",), "t.sh", "with --no_python (the program runs without python)"),
    (("--elastic",), "t.py", "with --elastic (torch's elastic agent starts the ranks)"),
    ((), "t.pyc", "to compiled bytecode (a .pyc script: the helper runs source as python would)"),
])
def test_where_ranks_cannot_be_forked_the_flag_is_refused_and_the_variable_unused(flags, script, why, capsys):
    with pytest.raises(UsageError, match=re.escape(f"--preload: does not apply {why}; leave --preload out")):
        preload_option(_ns("--preload=json", *flags), script, {})
    assert preload_option(_ns(*flags), script, {"XRUN_PRELOAD": "json"}) == ()
    assert capsys.readouterr().err == f"xrun: XRUN_PRELOAD=json is not used for this job: it does not apply {why}\n"


def test_the_modules_travel_in_the_node_spec_and_the_agents_command_line():
    spec = NodeSpec(host="h", node_rank=0, ranks=(), options=AgentOptions(preload=("torch", "transformers")))
    assert spec.to_json()["options"]["preload"] == ["torch", "transformers"]
    assert NodeSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert "preload" not in NodeSpec(host="h", node_rank=0, ranks=()).to_json()["options"]
    command = parse_agent_argv(["--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19", "--node_rank=0", "--preload=json,csv",
                                "x.py"])
    assert command.options.preload == ("json", "csv")
    assert parse_agent_argv(list(agent_argv(command)[4:])) == command


# -- refusals on the command line, the dry run alike -------------------------------------------------------------


@pytest.mark.parametrize("dry", [True, False])
@pytest.mark.parametrize(("flags", "says"), [
    (("--preload=",), "xrun: --preload: names no module; e.g. torch or torch,transformers"),
    (("--preload=json, csv",), "xrun: --preload: 'json, csv': no spaces"),
    (("--preload=./preload_mark.py",), "xrun: --preload: './preload_mark.py' is a path or a file name"),
    (("--preload=json", "--elastic"), "xrun: --preload: does not apply with --elastic"),
    (("--preload=no_such_module_here",), "xrun: --preload: no module 'no_such_module_here': install "
                                           "'no_such_module_here' for "),
    (("--preload=json.no_such_part",), "xrun: --preload: no module 'json.no_such_part'"),
])
def test_bad_preload_is_one_line_and_exit_2_before_any_rank(tmp_path, dry, flags, says):
    result = run_xrun(*(["--dry-run"] if dry else []), "--num_gpus", "2", *flags, RANK, f"dir={tmp_path}")
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(says), result.stderr
    assert os.listdir(tmp_path) == []  # no rank ran


@pytest.mark.parametrize(("module", "says"), [
    ("preload_raises", f"xrun: --preload: cannot import 'preload_raises' (RuntimeError: refusing to load here): "
                       f"install it for {sys.executable} or leave it out of --preload"),
    ("preload_thread", "xrun: --preload: importing 'preload_thread' started 1 Python thread(s) (ticker) that a fork "
                       "would not copy: leave 'preload_thread' out of --preload"),
    # tests/procs/preload_cuda.py says CUDA is initialised the one way the helper asks (the CPU build cannot start
    # it): this proves the check and its line; a real import that starts CUDA is the GPU suite's (tests/gpu)
    pytest.param("preload_cuda", "xrun: --preload: importing 'preload_cuda' initialised CUDA, and a rank forked "
                                 "after that cannot use the GPU", marks=pytest.mark.slow),
])
def test_a_module_that_cannot_be_preloaded_stops_the_run_in_one_line_before_any_rank(tmp_path, module, says):
    """Found (the dry run passes it: it does not import), but the helper refuses it on the run."""
    assert run_xrun("--dry-run", "--num_gpus", "2", f"--preload={module}", RANK).returncode == 0
    result = run_xrun("--num_gpus", "2", f"--preload={module}", RANK, f"dir={tmp_path}")
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(says), result.stderr
    assert os.listdir(tmp_path) == []


def test_another_interpreter_finds_the_modules_in_a_process_of_its_own(tmp_path):
    python = tmp_path / "python3"  # not this interpreter's path: asked, not looked up here
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    check_findable(str(python), ("json", "preload_mark", "os.path"), PROCS)
    with pytest.raises(PreloadError, match=re.escape(f"--preload: no module 'xml.nope': install 'xml.nope' for {python}")):
        check_findable(str(python), ("json", "xml.nope"), PROCS)
    with pytest.raises(PreloadError, match="no module 'preload_mark'"):
        check_findable(str(python), ("preload_mark",), str(tmp_path))  # not on that sys.path[0]


@pytest.mark.parametrize("dry", [True, False])
def test_a_ranks_interpreter_that_is_not_python_is_one_line_and_exit_2(tmp_path, dry):
    """--python bash runs a shell script as the ranks' program: nothing a python helper can fork."""
    script = tmp_path / "job.sh"
    script.write_text(f"touch {tmp_path}/ran\n")
    result = run_xrun(*(["--dry-run"] if dry else []), "--num_gpus", "1", "--python", "/bin/bash", "--preload=json",
                      str(script))
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(
        "xrun: --preload: /bin/bash did not answer as a Python interpreter (exit code 2: "), result.stderr
    assert result.stderr.rstrip().endswith("only ranks that python runs can be forked from the helper: leave "
                                           "--preload out")
    assert not (tmp_path / "ran").exists()


def test_the_dry_run_says_what_is_preloaded():
    result = run_xrun("--dry-run", "--num_gpus", "2", "--preload=json,preload_mark", RANK)
    assert result.returncode == 0, result.stderr
    assert "preload: each node's agent starts one helper that imports json,preload_mark before its ranks start" \
        in result.stdout
    assert "--preload=json,preload_mark" in result.stdout  # the agent's command line carries it
    data = json.loads(run_xrun("--dry-run=json", "--num_gpus", "2", "--preload=json", RANK).stdout)
    assert data["preload"] == ["json"]


# -- the ranks are forked from one helper, for every attempt -----------------------------------------------------


def test_every_rank_is_forked_from_one_helper_that_imported_the_modules_once():
    result = run_xrun("--num_gpus", "3", "--preload=preload_mark", RANK)
    assert result.returncode == 0, result.stderr
    pid = helper_pid(result.stderr)
    got = reports(result.stdout)
    assert sorted(r["rank"] for r in got) == [0, 1, 2]
    assert {r["mark_pid"] for r in got} == {pid} and {r["mark_t"] for r in got} != set()
    assert len({r["mark_t"] for r in got}) == 1 and all(r["pid"] != pid for r in got)
    assert not os.path.exists(f"/proc/{pid}")  # stopped with the job


def test_the_variable_turns_it_on_for_every_job_and_says_when_it_cannot():
    result = run_xrun("--num_gpus", "2", RANK, env={"XRUN_PRELOAD": "preload_mark"})
    assert result.returncode == 0, result.stderr
    assert {r["mark_pid"] for r in reports(result.stdout)} == {helper_pid(result.stderr)}
    plain = run_xrun("--num_gpus", "2", "--no_python", "/bin/true", env={"XRUN_PRELOAD": "preload_mark"})
    assert plain.returncode == 0, plain.stderr
    assert plain.stderr.splitlines()[0] == ("xrun: XRUN_PRELOAD=preload_mark is not used for this job: it does not "
                                            "apply with --no_python (the program runs without python)")


def test_a_restart_forks_the_next_attempt_from_the_same_helper():
    result = run_xrun("--num_gpus", "2", "--max_restarts", "1", "--preload=preload_mark", RANK, "fail=1")
    assert result.returncode == 0, result.stderr
    pid = helper_pid(result.stderr)
    got = reports(result.stdout)
    assert sorted((r["attempt"], r["rank"]) for r in got) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r["mark_pid"] for r in got} == {pid} and len({r["mark_t"] for r in got}) == 1  # imported once
    assert result.stderr.count("preloaded preload_mark in") == 1


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl is not installed")
def test_bound_forked_ranks_get_the_cpus_and_memory_policy_numactl_gives_started_ones():
    """--bind_cores_to_rank: a started rank runs under numactl; a forked one binds itself the same way."""
    args = ("--num_gpus", "2", "--bind_cores_to_rank", RANK, "membind=1")
    started, forked = run_xrun(*args), run_xrun("--preload=preload_mark", *args)
    assert started.returncode == 0 and forked.returncode == 0, (started.stderr, forked.stderr)
    view = {r["rank"]: (r["cpus"], r["policy"]) for r in reports(started.stdout)}
    assert view == {r["rank"]: (r["cpus"], r["policy"]) for r in reports(forked.stdout)}
    assert {r["mark_pid"] for r in reports(forked.stdout)} == {helper_pid(forked.stderr)}


# -- a forked rank is the rank xrun starts, through the whole run -----------------------------------------------

PROBE = os.path.join(PROCS, "preload_probe.py")
PER_JOB = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")  # each job's own, started or forked
PER_PROCESS = ("draws", "authkey", "torch_seed")  # each process's own: fresh random state


def probed(*flags: str, program: tuple[str, ...], env: dict[str, str] | None = None) -> tuple[dict, dict]:
    """tests/procs/preload_probe.py's report of each rank of ``xrun --num_gpus 2 FLAGS PROGRAM``, checked for what
    must hold of every rank xrun runs: (by rank, the reports less what is the job's or the process's own; by rank,
    what is the process's own)."""
    proc = _xrun("--num_gpus", "2", *flags, *program, env={"PROBE_VAR": "é x", **(env or {})})
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    same, own = {}, {}
    for line in out.splitlines():
        report = json.loads(line.split("] ", 1)[1])
        environ = report["environ"]
        rank = int(environ["RANK"])
        assert report["ppid"] == proc.pid  # the agent (xrun itself, on a local run) is the rank's parent
        assert report["session_leader"] and report["group_leader"]
        # what ps e and psutil see
        assert as_exec_gave(report["proc_environ"], rank, telemetry="--no_telemetry" not in flags) == environ
        assert report["cmdline"] == report["orig_argv"] and report["c_env"]["PROBE_VAR"] == "é x"
        assert (environ["LOCAL_RANK"], environ["WORLD_SIZE"], environ["LOCAL_WORLD_SIZE"]) == (str(rank), "2", "2")
        own[rank] = {key: report.pop(key) for key in PER_PROCESS if key in report}
        del report["ppid"], report["proc_environ"]
        report["environ"] = {k: v for k, v in environ.items() if k not in PER_JOB}
        same[rank] = report
    assert sorted(same) == [0, 1], out
    return same, own


def as_exec_gave(proc_environ: list[str], rank: int, *, telemetry: bool) -> dict[str, str]:
    """A rank's environment on /proc, which is what its exec was given (a started rank's) or what it shows of its
    own order (a forked rank's), less telemetry's variable and directory: those the rank's own start takes off its
    environment (xrun.launch.telemetry.site), and only those."""
    shown = dict(entry.split("=", 1) for entry in proc_environ)
    if not telemetry:
        return shown
    assert os.path.basename(shown.pop(SOCKET_VARIABLE)) == f"rank{rank}.sock"
    first, given, rest = shown.pop("PYTHONPATH").partition(os.pathsep)
    assert first == SITE_DIR
    return shown | ({"PYTHONPATH": rest} if given else {})


def differ(own: dict) -> None:
    """Each rank's random state is its own: every global generator's draw, multiprocessing's key, torch's seed."""
    first, second = own[0], own[1]
    assert first.keys() == second.keys()
    assert all(a != b for a, b in zip(first["draws"], second["draws"])) and first["authkey"] != second["authkey"]
    assert first.get("torch_seed") is None or first["torch_seed"] != second["torch_seed"]


@pytest.mark.parametrize("program", [(PROBE, "a b", "rand=1"), ("--module", "preload_probe", "rand=1")],
                         ids=["script", "module"])
def test_under_xrun_a_forked_rank_is_the_rank_xrun_starts(program):
    """The same job run as xrun starts its ranks and with --preload: every rank's report agrees (its environment,
    the env contract, argv and sys.path, __main__, stdio, signals, session, working directory), but for each job's
    own port and run id, and each process's own random state, which differs between the forked ranks too."""
    started, _ = probed(program=program)
    forked, own = probed("--preload=json,numpy", program=program)
    assert forked == started
    for report in forked.values():
        assert report["name"] == "__main__" and report["stdout"]["write_through"]  # python -u
    assert len(own[0]["draws"]) == 2  # random's and numpy's
    differ(own)


@pytest.mark.slow
@pytest.mark.torch
def test_under_xrun_a_rank_forked_from_torch_has_its_threads_random_state_and_multiprocessing():
    """--preload torch: torch.get_num_threads() is the rank's OMP_NUM_THREADS (xrun's, and one the user gives),
    torch's seed and every global generator differ between ranks, multiprocessing's spawn and fork pools work; the
    rest as started."""
    pytest.importorskip("torch")
    program = (PROBE, "torch=1", "rand=1", "mp=1")
    # without telemetry: a rank forked from torch's helper serves its Flight Recorder from its start, a started one
    # once its script imports torch (docs/preload.md), so their threads differ before that import
    (started, _), (forked, own) = [probed(*flags, "--no_telemetry", program=program) for flags in ((), ("--preload=torch",))]
    assert forked == started
    served, _ = probed("--preload=torch", program=program)
    assert all(served[rank]["threads"] > forked[rank]["threads"] == 1 for rank in served)
    differ(own)
    for report in forked.values():
        assert report["torch_threads"] == int(report["environ"]["OMP_NUM_THREADS"])
        assert report["mp_spawn"] == report["mp_fork"] == [1, 2, 3]
    given, own = probed("--preload=torch", program=program, env={"OMP_NUM_THREADS": "3"})
    assert [r["torch_threads"] for r in given.values()] == [3, 3]
    assert len(own[0]["draws"]) == 3  # random's, numpy's and torch's
    differ(own)


def test_a_forked_ranks_output_reaches_xrun_unflushed_while_it_runs(tmp_path):
    """python -u, as for a started rank: a print without flush is on xrun's stdout while the rank still runs."""
    script = tmp_path / "job.py"
    script.write_text("import time\nprint('early')\ntime.sleep(60)\n")
    proc = _xrun("--num_gpus", "1", "--preload=json", str(script), env={})
    got: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        got.append(proc.stdout.readline())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        reader.join(WAIT)
        assert got == ["[localhost:0] early\n"] and proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 130 and "preloaded json in" in err


# -- faults ---------------------------------------------------------------------------------------------------


def test_a_helper_killed_during_a_run_is_said_and_the_running_ranks_finish():
    # the last rank kills it, so every rank is forked by then (rank 0 killing it could beat rank 1's fork, which
    # then cannot start: tests/test_preload_group.py's test_a_dead_helper_fails_the_ranks_it_has_not_forked)
    result = run_xrun("--num_gpus", "2", "--preload=preload_mark", RANK, "kill_helper=1", "sleep=0.5")
    assert result.returncode == 0, result.stderr
    pid = helper_pid(result.stderr)
    assert (f"xrun[localhost]: the preload helper (pid {pid}) was killed by SIGKILL; the running ranks go on, but no "
            "rank can be forked from it again") in result.stderr
    assert len(reports(result.stdout)) == 2


def test_a_helper_killed_during_an_attempt_ends_the_job_before_the_next(tmp_path):
    result = run_xrun("--num_gpus", "2", "--max_restarts", "2", "--preload=preload_mark", RANK, "kill_helper=1",
                      "fail=1", f"dir={tmp_path}")
    assert result.returncode == 1, result.stderr
    pid = helper_pid(result.stderr)
    assert result.stderr.splitlines()[-1] == (
        f"xrun: --preload: the helper (pid {pid}) was killed by SIGKILL during the last attempt, so the next "
        "attempt's ranks cannot be forked on this node: the job ends here (if the OOM killer took it, preload fewer "
        "modules or give the node more memory)")
    assert sorted(os.listdir(tmp_path)) == ["up-0-0", "up-1-0"]  # no rank of a second attempt


def _watch(proc: subprocess.Popen[str], lines: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _xrun(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "xrun", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT}:{PROCS}", **env})


def test_a_rank_forked_while_the_helper_is_killed_is_never_left_running(tmp_path):
    """preload_slowfork makes each fork slow and says when one begins: the helper is killed while it forks the
    first rank. That rank cannot start (its start error names the helper's death), it never runs its program, the
    others are not forked, and nothing of the job is left."""
    marker = f"preload-forking-{os.getpid()}-{time.monotonic_ns()}"
    forks = tmp_path / "forks"
    forks.mkdir()
    proc = _xrun("--num_gpus", "2", "--preload=preload_slowfork", RANK, f"dir={tmp_path}", "sleep=30",
                 env={"PRELOAD_FORK_DIR": str(forks), "XRUN_TEST_MARK": marker})
    lines: list[str] = []
    reader = _watch(proc, lines)
    try:
        _wait_for(lambda: any("preloaded" in line for line in lines), "the helper to be ready")
        pid = helper_pid("".join(lines))
        trial = set(os.listdir(forks))  # the helper's trial forks while it imported
        _wait_for(lambda: set(os.listdir(forks)) - trial, "the first rank's fork to begin")
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(WAIT) == 126
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(WAIT)
    said = "".join(lines)
    assert re.search(r"cannot fork rank 0: the preload helper \(pid \d+\) (was killed by SIGKILL|answered)", said), said
    time.sleep(1.0)  # the middle process's slow fork ends; a rank it forked wakes to its closed hold pipe
    assert processes_with_marker(f"XRUN_TEST_MARK={marker}") == []
    assert not [name for name in os.listdir(tmp_path) if name.startswith("up-")]  # no rank ran its program


def test_kill_9_of_xrun_leaves_neither_ranks_nor_helper(tmp_path):
    marker = f"preload-kill9-{os.getpid()}-{time.monotonic_ns()}"
    proc = _xrun("--num_gpus", "2", "--preload=preload_mark", RANK, f"dir={tmp_path}", "sleep=60",
                 env={"XRUN_TEST_MARK": marker})
    lines: list[str] = []
    reader = _watch(proc, lines)
    try:
        _wait_for(lambda: len([n for n in os.listdir(tmp_path) if n.startswith("up-")]) == 2, "both ranks to run")
        pid = helper_pid("".join(lines))
        assert pid in processes_with_marker(f"XRUN_TEST_MARK={marker}")  # xrun, its watchdog, helper and ranks
        proc.kill()
        proc.wait(WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(WAIT)
    _wait_for(lambda: not processes_with_marker(f"XRUN_TEST_MARK={marker}"), "everything of the job to die with xrun")
    _wait_for(lambda: not (info := proctable.read_proc(pid)) or not info.alive, "the helper to die with xrun")
