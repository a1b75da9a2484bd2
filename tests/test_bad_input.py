"""Issue 12's table, one row per class of bad input: exit 2, one line on stderr naming the file, line, host or
flag, no traceback, and a bounded time (every run is a real ``xrun`` subprocess with a timeout)."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, run_xrun
from xrun.errors import XrunError

TWO_WORKERS = os.path.join(ROOT, "hostfiles", "two-workers")
TIME_BOUND = 20  # seconds: every row used to take 4-27 s, minutes or forever


def assert_one_line_error(result, needle):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
    assert needle in result.stderr, result.stderr


def hostfile(tmp_path, content):
    path = tmp_path / "hf"
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return str(path)


# (hostfile content, needle): the hostfile's path and the host or line it names.
HOSTFILE_ROWS = {
    "host-dot": (". slots=1\n", "'.' is not a host name"),
    "host-empty-label": ("a..b slots=1\n", "'a..b' is not a host name"),
    "host-long-label": ("a" * 64 + " slots=1\n", "is not a host name"),
    "host-bidi-control": ("zz-\u202e slots=1\n", "is not a host name"),
    "host-nul": (b"a\0b slots=1\n", "is not a host name"),
    "slots-1e9": ("w slots=1000000000\n", "the most xrun accepts per host"),
    "slots-20-digits": ("w slots=99999999999999999999\n", "the most xrun accepts per host"),
    "range-1e10": ("node[0-9999999999] slots=1\n", "the most xrun accepts"),
    "range-1e6": ("node[01-1000000] slots=1\n", "the most xrun accepts"),
    "range-cubed": ("node[0-999][0-999][0-999] slots=1\n", "the most xrun accepts"),
    "range-5000-digits": ("node[0-" + "9" * 5000 + "] slots=1\n", "bad range"),
    "100k-hosts": ("".join(f"h{i} slots=1\n" for i in range(100_000)), "the most xrun accepts"),
    "slots-total": ("node[0-65535] slots=16\n", "the most ranks xrun accepts"),
    "unicode-digit-slots": ("w slots=\u0663\n", "slots must be a positive integer"),
    "host-case-duplicate": ("w1 slots=1\nW1 slots=1\n", ":2: 'W1 slots=1': host 'W1' is already listed on line 1 as 'w1'"),
    "utf-16": ("w1 slots=1\n".encode("utf-16"), ":1: is not UTF-8 text (byte 0xff); save the hostfile as UTF-8"),
    "latin-1-on-line-2": (b"w1 slots=1\nw\xe9 slots=1\n", ":2: is not UTF-8 text (byte 0xe9)"),
}


@pytest.mark.parametrize("content, needle", list(HOSTFILE_ROWS.values()), ids=list(HOSTFILE_ROWS))
def test_bad_hostfile(tmp_path, content, needle):
    path = hostfile(tmp_path, content)
    result = run_xrun("--dry-run", "-H", path, "t.py", timeout=TIME_BOUND)
    assert_one_line_error(result, needle)
    assert path in result.stderr


def test_hostfile_that_is_a_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_one_line_error(run_xrun("-H", str(fifo), "t.py", timeout=TIME_BOUND), f"{fifo}: is not a regular file")


def test_hostfile_dev_zero_is_not_read():
    assert_one_line_error(run_xrun("-H", "/dev/zero", "t.py", timeout=TIME_BOUND), "/dev/zero: is not a regular file")


def test_env_file_that_is_a_fifo_does_not_block(tmp_path):
    os.mkfifo(tmp_path / ".xrun_env")
    result = run_xrun("--dry-run", "-H", TWO_WORKERS, "t.py", cwd=str(tmp_path), env={"HOME": str(tmp_path / "h")},
                      timeout=TIME_BOUND)
    assert_one_line_error(result, ".xrun_env")
    assert "is not a regular file" in result.stderr


def test_hostfile_bom_is_dropped(tmp_path):
    path = hostfile(tmp_path, "\ufefflocalhost slots=2\n")
    result = run_xrun("--dry-run=json", "-H", path, "t.py", timeout=TIME_BOUND)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["nodes"][0]["host"] == "localhost"


FLAG_ROWS = {
    "num-gpus-1e30": (["--num_gpus", str(10**30)], "--num_gpus"),
    "num-gpus-70000": (["--num_gpus", "70000"], "more than 1024"),
    "num-gpus-unicode": (["--num_gpus", "\u0663"], "ASCII digits"),
    "master-port-unicode": (["--master_port", "\u0663"], "--master_port"),
    "shutdown-inf": (["--shutdown_timeout", "inf"], "--shutdown_timeout"),
    "shutdown-1e308": (["--shutdown_timeout", "1e308"], "--shutdown_timeout"),
    "shutdown-nan": (["--shutdown_timeout", "nan"], "--shutdown_timeout"),
    "join-nan": (["--elastic", "--join_timeout", "nan"], "--join_timeout"),
    "join-inf": (["--elastic", "--join_timeout", "inf"], "--join_timeout"),
    "rdzv-is-host": (["--elastic", "--rdzv_conf", "is_host=maybe"], "is_host='maybe'"),
    "rdzv-store-type": (["--elastic", "--rdzv_conf", "store_type=bogus"], "store_type='bogus'"),
    "rdzv-port-abc": (["--elastic", "--rdzv_endpoint", "127.0.0.1:abc"], "--rdzv_endpoint"),
    "rdzv-open-bracket": (["--elastic", "--rdzv_endpoint", "[::1"], "--rdzv_endpoint"),
    "rdzv-empty-port": (["--elastic", "--rdzv_endpoint", "host:"], "--rdzv_endpoint"),
    "rdzv-etcd": (["--elastic", "--rdzv_backend", "etcd"], "--rdzv_backend"),
    "control-addr": (["-H", TWO_WORKERS, "--control_addr", "garbage"], "--control_addr"),
    "log-dir-proc": (["--log_dir", "/proc/x"], "--log_dir"),
    "log-dir-dev-null": (["--log_dir", "/dev/null"], "--log_dir"),
    "log-dir-too-long": (["--log_dir", "/tmp/" + "d" * 300], "--log_dir"),
    "log-dir-too-deep": (["--log_dir", "a/" * 2000], "--log_dir"),
    "hostfile-newline": (["-H", "a\nb"], "a\\nb: no such file"),
    "flag-newline": (["--bog\nus"], "--bog\\nus"),
    "python-missing": (["--python", "/nonexistent"], "--python '/nonexistent'"),
    "no-python-not-executable": (["--no_python", "README.md"], "--no_python program 'README.md'"),
    "module-missing": (["--module", "no_such_module_xyz"], "--module 'no_such_module_xyz'"),
    "console-ranks-superscript": (["--console_ranks", "\u00b2"], "'\u00b2' is not a rank"),
    "console-ranks-unicode-digit": (["--console_ranks", "\u0663"], "is not a rank or a low-high range"),
    # argparse drops a value that is '--' and gave the flag an empty list: a TypeError traceback
    "value-is-separator": (["--num_gpus=--"], "--num_gpus: is missing its value"),
    "value-before-separator": (["--hostfile", "--"], "--hostfile: is missing its value"),
    "short-value-is-separator": (["-i--"], "-i: is missing its value"),
    # torchrun's flags (issue 41)
    "nnodes-0": (["--nnodes", "0"], "--nnodes: '0': a job needs at least 1 node"),
    "nnodes-backwards": (["--nnodes", "3:2"], "--nnodes: '3:2': MIN is more than MAX"),
    "nnodes-x": (["--nnodes", "x"], "--nnodes: 'x' is not N or MIN:MAX"),
    "nnodes-more-than-the-world": (["--nnodes", "2", "-H", TWO_WORKERS, "--num_nodes", "1"],
                                   "--nnodes: 2, but this job has 1 node(s)"),
    "tee-9": (["--tee", "9"], "--tee: '9' is not 0-3"),
    "redirects-0:4": (["--redirects", "0:4"], "--redirects: '0:4' is not 0-3"),
    "local-ranks-filter-x": (["--local-ranks-filter", "x"], "--local-ranks-filter: 'x'"),
    "standalone-hostfile": (["--standalone", "-H", TWO_WORKERS], "--standalone: runs on this machine only"),
    "static-rdzv-etcd": (["--rdzv_backend", "etcd"], "--rdzv_backend: 'etcd': a static job"),
    "rdzv-endpoint-port-and-master-port": (["--rdzv_endpoint", "localhost:1234", "--master_port", "1235"],
                                           "--rdzv_endpoint: 'localhost:1234': its port is not --master_port"),
    "signals-to-handle-bogus": (["--signals-to-handle", "SIGBOGUS"], "--signals-to-handle: 'SIGBOGUS'"),
    "numa-binding-without-gpus": (["--numa-binding", "node"], "--numa-binding node: needs every rank's GPU"),
    "numa-binding-core-complex-without-gpus": (["--numa-binding", "core-complex"],
                                               "--numa-binding core-complex: needs every rank's GPU"),
    "numa-binding-bogus": (["--numa-binding", "bogus"], "--numa-binding"),
    "start-method-bogus": (["--start-method", "thread"], "--start-method"),
    "nproc-per-node-word": (["--nproc-per-node", "many"], "or one of auto, gpu, cpu"),
}


@pytest.mark.parametrize("args, needle", list(FLAG_ROWS.values()), ids=list(FLAG_ROWS))
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_bad_flag(args, needle, dry_run):
    script = [] if "--module" in args else ["t.py"]
    module = ["no_such_module_xyz"] if "--module" in args else []
    args = [a for a in args if a != "no_such_module_xyz"]
    result = run_xrun(*(["--dry-run"] if dry_run else []), *args, *script, *module, timeout=TIME_BOUND)
    assert_one_line_error(result, needle)


# (command, its arguments, the one line it prints): a misspelled flag is named with the flag meant; a flag the
# command does not have says where a script's own flags go (issue 25 §7).
UNKNOWN_FLAG_ROWS = {
    "num-gpu": ([], ["--num-gpu", "2", "hello.py"], "xrun: unknown flag --num-gpu (did you mean --num-gpus?)"),
    "nnode": ([], ["--nnode", "2", "hello.py"], "xrun: unknown flag --nnode (did you mean --nnodes?)"),
    "lr": ([], ["--lr", "3", "hello.py"], "xrun: unknown flag --lr: not a flag of xrun; "
                                          "arguments for the script go after it (xrun hello.py --lr 3)"),
    "check": ([], ["check", "--num-gpu", "2"], "xrun check: unknown flag --num-gpu (did you mean --num-gpus?)"),
    "agent-lr": (["-m", "xrun.launch"], ["--lr", "3", "t.py"],
                 "xrun.launch: unknown flag --lr: not a flag of python -m xrun.launch; "
                 "arguments for the script go after it (python -m xrun.launch t.py --lr 3)"),
    "agent-abbrev": (["-m", "xrun.launch"], ["--world_inf=x", "t.py"],
                     "xrun.launch: unknown flag --world_inf (did you mean --world_info?)"),
}


@pytest.mark.parametrize("command, args, line", list(UNKNOWN_FLAG_ROWS.values()), ids=list(UNKNOWN_FLAG_ROWS))
def test_unknown_flag_is_named_with_what_was_meant(command, args, line):
    if command:  # the node agent, as a user would type it
        result = subprocess.run([sys.executable, *command, *args], capture_output=True, text=True, cwd=ROOT,
                                timeout=TIME_BOUND)
    else:
        result = run_xrun(*args, timeout=TIME_BOUND)
    assert_one_line_error(result, line)
    assert result.stderr == line + "\n"


@pytest.mark.parametrize("script", ["nope.py", "-weird.py"])
def test_missing_script_refused_by_dry_run_and_run(script):
    for dry in (["--dry-run"], []):
        assert_one_line_error(run_xrun(*dry, "--", script, timeout=TIME_BOUND), f"SCRIPT {script!r}: no such file")


def test_a_directory_is_run_by_its_main_as_python_does(tmp_path):
    (tmp_path / "app").mkdir()
    assert_one_line_error(run_xrun("app", cwd=str(tmp_path), timeout=TIME_BOUND),
                          "SCRIPT 'app': is a directory without __main__.py")
    (tmp_path / "app" / "__main__.py").write_text("print('ran')\n")
    result = run_xrun("--no_local_rank", "app", cwd=str(tmp_path), timeout=TIME_BOUND)
    assert result.returncode == 0 and "ran" in result.stdout, result.stderr


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "run"])
def test_a_removed_working_directory_is_one_line(tmp_path, dry_run):
    gone = tmp_path / "gone"
    gone.mkdir()
    (tmp_path / "ok.py").write_text("pass\n")
    result = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone),
                             sys.executable, "-m", "xrun", *dry_run, str(tmp_path / "ok.py")],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=TIME_BOUND)
    assert_one_line_error(result, "the working directory no longer exists")


@pytest.mark.parametrize("closed", [(2,), (1, 2), (0, 1, 2)], ids=["stderr", "stdout+stderr", "all"])
@pytest.mark.parametrize("command", [["-m", "xrun"], ["-m", "xrun.launch", "--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19",
                                                       "--node_rank=0"]], ids=["xrun", "agent"])
def test_closed_standard_streams_keep_the_ranks_exit_code(tmp_path, closed, command):
    # xrun train.py 2>&-: every notice was an EBADF traceback (exit 1), or went into whatever took fd 2
    (tmp_path / "fail.py").write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")

    def close_them() -> None:
        for fd in closed:
            os.close(fd)

    two = ["--num_gpus", "2"] if command[1] == "xrun" else []  # the agent's world has two slots
    result = subprocess.run([sys.executable, *command, *two, "fail.py"], cwd=str(tmp_path),
                            env={**os.environ, "PYTHONPATH": ROOT}, timeout=TIME_BOUND, preexec_fn=close_them)
    assert result.returncode == 3


def test_a_console_reader_that_went_away_keeps_the_ranks_exit_code(tmp_path):
    # xrun train.py 2>&1 | head -1: the failure report hit the closed pipe, a BrokenPipeError made the code 1
    (tmp_path / "fail.py").write_text("import os, sys\nfor i in range(20000):\n    print('line', i)\n"
                                      "sys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    proc = subprocess.Popen([sys.executable, "-m", "xrun", "--num_gpus", "2", "fail.py"], cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=TIME_BOUND) == 3


def test_a_summary_that_cannot_be_written_keeps_the_ranks_exit_code(tmp_path):
    # the log disk full, or something else where the file goes: a traceback and exit 1, even for a job that ran.
    # What is there before the start the preflight refuses; here a rank puts it there while the job runs.
    (tmp_path / "fail.py").write_text("import os, sys, time\nnames = ('failure.json', 'summary.json')\n"
                                      "if os.environ['RANK'] == '0':\n"
                                      "    for name in names:\n"
                                      "        os.mkdir(os.path.join('logs', 'localhost', name))\n"
                                      "    sys.exit(0)\n"
                                      "while not os.path.isdir(os.path.join('logs', 'localhost', names[1])):\n"
                                      "    time.sleep(0.01)\n"
                                      "sys.exit(3)\n")
    result = run_xrun("--num_gpus", "2", "--log_dir", "logs", "fail.py", cwd=str(tmp_path), timeout=TIME_BOUND)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert "xrun: cannot write logs/localhost/summary.json: Is a directory\n" in result.stderr


def test_a_log_file_that_takes_no_more_is_said_once(capfd):
    # ENOSPC on a rank's log used to be ignored on every chunk: the logs ended mid-run without a word
    from xrun.common.output.streams import Console, RankStream
    from xrun.common.output.writer import writer

    full = os.open("/dev/full", os.O_WRONLY)
    console = Console(prefix=True, quiet=True, host="h")
    stream = RankStream(-1, 1, log=full, rank=3)
    console.consume(stream, b"one\n")
    console.consume(stream, b"two\n")
    assert writer().drain()
    assert stream.log is None  # closed: no more tries
    err = capfd.readouterr().err
    assert err == "xrun[h]: cannot write rank 3's stdout.log (disk full?): the rest of it is not logged\n"


def test_existing_dash_script_runs(tmp_path):
    (tmp_path / "-weird.py").write_text("print('ran')\n")
    result = run_xrun("--", "-weird.py", cwd=str(tmp_path), timeout=TIME_BOUND)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "run"])
def test_a_huge_console_rank_range_is_refused_before_it_is_expanded(dry_run):
    # every rank of 0-99999999999 went into a set: minutes and gigabytes (bounded here, so that a regression
    # fails with a MemoryError instead of taking the machine's memory)
    import resource

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    result = subprocess.run([sys.executable, "-m", "xrun", *dry_run, "--console_ranks", "0-99999999999", "t.py"],
                            capture_output=True, text=True, cwd=ROOT, timeout=TIME_BOUND, preexec_fn=bounded)
    assert_one_line_error(result, "rank '99999999999' is past the most ranks xrun accepts (131072)")


def test_check_refuses_a_value_that_is_the_separator():
    assert_one_line_error(run_xrun("check", "--num_gpus=--", timeout=TIME_BOUND), "--num_gpus: is missing its value")


def test_agent_refuses_a_value_that_is_the_separator():
    result = subprocess.run([sys.executable, "-m", "xrun.launch", "--world_info=e30=", "--node_rank=--", "t.py"],
                            capture_output=True, text=True, cwd=ROOT, timeout=TIME_BOUND)
    assert_one_line_error(result, "--node_rank: is missing its value")


@pytest.mark.parametrize("flag, needle", [
    ("--master_port=0", "--master_port: 0 is not a TCP port (1..65535)"),
    ("--master_port=99999", "--master_port: 99999 is not a TCP port"),
    ("--master_addr=a b", "--master_addr: 'a b' is not a host name or IP address"),
])
def test_agent_refuses_a_rendezvous_no_rank_could_use(flag, needle):
    # every rank got MASTER_PORT=99999 or MASTER_ADDR='a b' and failed on its own in torch's rendezvous
    result = subprocess.run([sys.executable, "-m", "xrun.launch", "--world_info=eyJsb2NhbGhvc3QiOiBbMF19",
                             "--node_rank=0", flag, "t.py"], capture_output=True, text=True, cwd=ROOT,
                            timeout=TIME_BOUND)
    assert_one_line_error(result, needle)


# An endpoint that does not resolve (issue 37 §3): torch's c10d store retried it for 125 s, printed its C++ stack and
# left an agent that would not stop (exit 124). RFC 6761: a .invalid name never resolves, on any host.
UNRESOLVED = ["no-such-host.invalid", "no-such-host.invalid:29400", "[no::such]:29400"]


@pytest.mark.parametrize("endpoint", UNRESOLVED)
@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "run"])
def test_an_elastic_endpoint_that_does_not_resolve_is_one_line_before_torch(tmp_path, endpoint, dry_run):
    (tmp_path / "t.py").write_text("print('ran')\n")
    started = time.monotonic()
    result = run_xrun(*dry_run, "--elastic", "--rdzv_endpoint", endpoint, "t.py", cwd=str(tmp_path),
                      timeout=TIME_BOUND)
    assert time.monotonic() - started < 10
    host = endpoint.rpartition(":")[0].strip("[]") if endpoint.endswith(":29400") else endpoint
    assert_one_line_error(result, f"xrun: --rdzv_endpoint {endpoint!r}: the host {host!r} does not resolve on "
                                  "localhost (Name or service not known); give a name or address")
    assert result.stdout == ""


def test_the_agent_refuses_an_elastic_endpoint_that_does_not_resolve_on_its_node(tmp_path):
    """Several nodes: each agent looks the name up where torch will, before the barrier (a name only the nodes
    resolve is fine); a finding there ends the job with 2 on every node, naming the host."""
    (tmp_path / "t.py").write_text("print('ran')\n")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "xrun.launch", "--world_info=eyJsb2NhbGhvc3QiOiBbMF19",
                             "--node_rank=0", "--elastic", "--rdzv_endpoint=no-such-host.invalid:29400", "t.py"],
                            capture_output=True, text=True, cwd=str(tmp_path), timeout=TIME_BOUND)
    assert time.monotonic() - started < 10
    assert_one_line_error(result, "xrun.launch: --rdzv_endpoint 'no-such-host.invalid:29400': the host "
                                  "'no-such-host.invalid' does not resolve on localhost")


def test_a_remote_dry_run_leaves_the_endpoint_to_the_nodes():
    result = run_xrun("--dry-run", "-H", TWO_WORKERS, "--elastic", "--rdzv_endpoint", "only-the-nodes.invalid",
                      "t.py", timeout=TIME_BOUND)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("args, needle", [
    (["--master_port", "70000"], "--master_port: 70000 is not a TCP port"),
    (["--ssh_port", "0"], "--ssh_port: 0 is not a TCP port"),
    (["--master_port", "\u0663"], "--master_port"),
    (["--control_addr", "a b"], "--control_addr: 'a b' is not a host name or IP address"),
    (["--python", ""], "--python: is empty"),
])
def test_check_validates_ports(args, needle):
    result = run_xrun("check", "-H", TWO_WORKERS, *args, timeout=TIME_BOUND)
    assert_one_line_error(result, needle)
    assert result.stdout == ""


def test_undecodable_argument_is_printed_escaped():
    # $'\xff' reaches Python as a lone surrogate; a strict UTF-8 stdout used to raise UnicodeEncodeError.
    result = run_xrun("--dry-run", "t.py", "\udcff", env={"PYTHONIOENCODING": "utf-8"}, timeout=TIME_BOUND)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "\\udcff" in result.stdout or "\\xff" in result.stdout


def test_undecodable_argument_reaches_the_rank_byte_exact(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint(repr(os.fsencode(sys.argv[-1])))\n")
    result = run_xrun("--no_local_rank", "--no_prefix", str(script), "\udcff", env={"PYTHONIOENCODING": "utf-8"},
                      timeout=TIME_BOUND)
    assert result.returncode == 0, result.stderr
    assert "b'\\xff'" in result.stdout



@pytest.mark.parametrize("args", [["--dry-run", "--num_gpus", "1024", "t.py"], ["--dry-run=json", "t.py"], ["check"]],
                         ids=["dry-run", "dry-run-json", "check"])
def test_a_stdout_reader_that_went_away_is_no_traceback(args):
    # xrun --dry-run | head -1, | grep -q: the reader closes the pipe before xrun has printed everything
    proc = subprocess.Popen([sys.executable, "-m", "xrun", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=ROOT, text=True)
    proc.stdout.close()
    _, err = proc.communicate(timeout=TIME_BOUND)
    assert "Traceback" not in err, err
    assert proc.returncode == 0, err  # what the command decided: the plan is valid, this host is fine

# -- an engine, ssh or pdsh that fails before its agents connect ends the start barrier at once ---------------

FAKE_UNREACHABLE = "#!/bin/sh\necho 'ssh: connect to host {host} port 22: Connection refused' >&2\nexec sleep 600\n"


@pytest.mark.parametrize("launcher, program", [("mpich", "mpiexec.hydra"), ("pdsh", "pdsh")])
@pytest.mark.parametrize("spelled, said", [("n2", "n2"), ("N2", "n2"), ("127.2", "127.0.0.2")],
                         ids=["as-written", "lowercased", "resolved"])
def test_launcher_that_cannot_reach_a_node_ends_the_barrier_at_once(tmp_path, launcher, program, spelled, said):
    # Like hydra: it says the node is unreachable, then waits for a proxy that never comes. ssh names the host as
    # it connected to it, not as the hostfile spells it (issue 33 §3: xrun waited the whole --join_timeout)
    fake = tmp_path / "bin" / program
    fake.parent.mkdir()
    fake.write_text(FAKE_UNREACHABLE.format(host=said))
    fake.chmod(0o755)
    hosts = hostfile(tmp_path, f"n1 slots=1\n{spelled} slots=1\n")
    result = run_xrun("--launcher", launcher, "-H", hosts, "--control_addr", "127.0.0.1", "--join_timeout", "600",
                      "t.py", env={"PATH": f"{fake.parent}:{os.environ['PATH']}"}, timeout=TIME_BOUND)
    assert result.returncode == 255, result.stderr
    assert "Traceback" not in result.stderr
    assert (f"the session to {spelled} exited with code 255 before its agent connected "
            f"({program}: ssh: connect to host {said} port 22: Connection refused)") in result.stderr


def test_launcher_lines_that_name_an_unreachable_host():
    from xrun.runner.backends.launcher_process import unreachable_host

    assert unreachable_host("ssh: connect to host node1 port 22: Connection refused") == "node1"
    assert unreachable_host("ssh: Could not resolve hostname nodex: Name or service not known\r") == "nodex"
    assert unreachable_host("root@node2: Permission denied (publickey,password).") == "node2"
    assert unreachable_host("pdsh@head: node3: ssh exited with exit code 255") == "node3"
    intel = "[mpiexec@head] Error: Unable to run bstrap_proxy on Node4 (pid 24740, exit code 65280)"
    assert unreachable_host(intel) == "Node4"  # Intel MPI's hydra keeps ssh's words to itself
    assert unreachable_host("[node1:0] ssh: connect to host") is None
    assert unreachable_host("loss 0.25") is None


def test_the_host_a_launcher_names_is_found_in_the_jobs_spelling():
    from xrun.runner.backends.launcher_process import LaunchedHosts
    from xrun.runner.remote_options import SshSettings

    hosts = LaunchedHosts(["n1", "HeadNode", "127.2"], SshSettings())
    assert hosts.which("n1") == "n1"
    assert hosts.which("headnode") == "HeadNode"  # OpenSSH lowercases the name
    assert hosts.which("127.0.0.2") == "127.2"  # ssh prints the address it connected to
    assert hosts.which("no-such-node.invalid") is None  # none of the job's: every node not yet connected
    assert hosts.which("127.0.0.3") is None


# What only a node can tell, checked by its agent there: (set-up on tmp_path, xrun's arguments, the job's line).
AGENT_PREFLIGHT = {
    "missing-script": (lambda t: None, ["nope.py"], "xrun: job failed: agent on localhost: SCRIPT 'nope.py': no such "
                                                    "file in {tmp}"),
    # issue 33 §2: rank 0 failed with 126 and its failure table, then the job with it
    "stdout.log-link": (lambda t: _planted(t / "logs/localhost/rank0/stdout.log", "link"),
                        ["--log_dir", "logs", "hello.py"],
                        "xrun: job failed: --log_dir 'logs/localhost/rank0/stdout.log': is a symbolic link where "
                        "this rank's log file goes"),
    # the agent died of its BindingError after the barrier: "lost node localhost", exit 1
    "binding": (lambda t: None, ["--bind_cores_to_rank", "--bind_core_list", "999", "hello.py"],
                "xrun: job failed: agent on localhost: core binding: --bind_core_list '999': CPUs 999 are outside"),
    # an env file's value past exec's one-string limit travelled to the node: its ranks died of E2BIG (126)
    "env-file-value": (lambda t: (t / ".xrun_env").write_text("BIG=" + "x" * 200_000 + "\n"), ["hello.py"],
                       "xrun: job failed: agent on localhost: environment variable 'BIG': is 200,004 bytes"),
}


@pytest.mark.parametrize("setup, args, line", list(AGENT_PREFLIGHT.values()), ids=list(AGENT_PREFLIGHT))
def test_remote_only_check_is_one_line_naming_the_host_and_exit_2(tmp_path, setup, args, line):
    # The agent checks what only its node can tell; hydra on localhost stands in for a remote node.
    if shutil.which("mpiexec.hydra") is None:
        pytest.skip("mpiexec.hydra not installed")
    (tmp_path / "hello.py").write_text("print('rank ran')\n")
    setup(tmp_path)
    result = run_xrun("--launcher", "mpich", "--num_gpus", "1", *args, cwd=str(tmp_path), timeout=TIME_BOUND)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "rank ran" not in result.stdout
    assert result.stderr.startswith(line.format(tmp=tmp_path)), result.stderr
    assert result.stderr.count("\n") == 1 and "(exit code 2)" in result.stderr, result.stderr


def test_node_preflight_finds_modules_without_importing_them(tmp_path, monkeypatch):
    from xrun.common.preflight import PreflightError, check_node
    from xrun.common.spec import PythonMode

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (tmp_path / "pkg" / "train.py").write_text("")
    check_node(sys.executable, PythonMode.MODULE, "pkg.train", None)  # found, and pkg/__init__ never ran
    check_node(sys.executable, PythonMode.MODULE, "sys", None)  # built in: not on sys.path
    check_node("/usr/bin/env", PythonMode.MODULE, "only.in.that.python", None)  # another python: its own path
    with pytest.raises(PreflightError, match="no module 'pkg.nope'"):
        check_node(sys.executable, PythonMode.MODULE, "pkg.nope", None)
    with pytest.raises(PreflightError, match="'pkg.train' is not a package"):
        check_node(sys.executable, PythonMode.MODULE, "pkg.train.x", None)
    # python -m pkg runs pkg/__main__.py: without one every rank failed (code 1) after a dry run that passed
    with pytest.raises(PreflightError, match="--module 'pkg': is a package without __main__.py"):
        check_node(sys.executable, PythonMode.MODULE, "pkg", None)
    (tmp_path / "pkg" / "__main__.py").write_text("")
    check_node(sys.executable, PythonMode.MODULE, "pkg", None)
    assert not list(tmp_path.glob("**/__pycache__"))


def test_an_unreadable_script_is_refused_by_the_preflight(tmp_path, monkeypatch):
    # the dry run passed, then every rank died of python's "can't open file" (root reads anything: os.access
    # answers as for another user here)
    from xrun.common import preflight
    from xrun.common.preflight import PreflightError, check_node
    from xrun.common.spec import PythonMode

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    real_access = os.access
    monkeypatch.setattr(preflight.os, "access", lambda path, mode, **kw: path != str(script) and real_access(path, mode))
    with pytest.raises(PreflightError, match="SCRIPT '.*train.py': is not readable"):
        check_node(sys.executable, PythonMode.SCRIPT, str(script), None)


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "run"])
def test_a_program_whose_interpreter_is_missing_is_named(tmp_path, dry_run):
    # exec's ENOENT was reported as the program itself missing, from every rank, code 127
    program = tmp_path / "tool"
    program.write_text("#!/nonexistent/python -u\nprint('hi')\n")
    program.chmod(0o755)
    result = run_xrun(*dry_run, "--no_python", "./tool", cwd=str(tmp_path), timeout=TIME_BOUND)
    assert_one_line_error(result, "--no_python program './tool': its #! interpreter '/nonexistent/python' is not "
                                  "an executable file")


def _planted(path, kind):
    """Put ``kind`` where xrun will write: a link to a file that must never appear, a directory, or a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link":
        path.symlink_to(path.parent.parent.parent / "must-not-appear")
    elif kind == "dir":
        path.mkdir()
    else:
        path.write_text("")


def _program(path, text):
    path.write_bytes(text)
    path.chmod(0o755)


# Issue 33 §2: what the preflight knows, said before any rank starts (one line, exit 2), where each used to be rank
# 0's failure (exit 126 or 127 and a seven-line failure table). (set-up on tmp_path, xrun's arguments, the line.)
BEFORE_THE_START = {
    "stdout.log-link": (lambda t: _planted(t / "logs/localhost/rank0/stdout.log", "link"),
                        ["--log_dir", "logs", "hello.py"],
                        "--log_dir 'logs/localhost/rank0/stdout.log': is a symbolic link where this rank's log file "
                        "goes (xrun writes only files it creates); remove it or choose another --log_dir"),
    "stderr.log-dangling-link": (lambda t: _planted(t / "logs/localhost/rank1/stderr.log", "link"),
                                 ["--log_dir", "logs", "--nproc_per_node", "2", "hello.py"],
                                 "--log_dir 'logs/localhost/rank1/stderr.log': is a symbolic link where"),
    "stdout.log-directory": (lambda t: _planted(t / "logs/localhost/rank0/stdout.log", "dir"),
                             ["--log_dir", "logs", "hello.py"],
                             "--log_dir 'logs/localhost/rank0/stdout.log': is a directory where this rank's log file"),
    "rank-folder-a-file": (lambda t: _planted(t / "logs/localhost/rank0", "file"), ["--log_dir", "logs", "hello.py"],
                           "--log_dir 'logs/localhost/rank0': is not a directory, and this rank's log files go in it"),
    "node-folder-a-file": (lambda t: _planted(t / "logs/localhost", "file"), ["--log_dir", "logs", "hello.py"],
                           "--log_dir 'logs/localhost': is not a directory, and this node's log folders go in it"),
    "summary.json-directory": (lambda t: _planted(t / "logs/localhost/summary.json", "dir"),
                               ["--log_dir", "logs", "hello.py"],
                               "--log_dir 'logs/localhost/summary.json': is a directory where xrun writes this node's "
                               "report"),
    "windows-line-ends": (lambda t: _program(t / "run.sh", b"#!/bin/sh\r\necho hi\r\n"), ["--no_python", "./run.sh"],
                          "--no_python program './run.sh': has Windows line ends: its #! line names '/bin/sh\\r'; "
                          "convert it (dos2unix, or sed -i 's/\\r$//')"),
    "no-#!-line": (lambda t: _program(t / "run.sh", b"echo hi\n"), ["--no_python", "./run.sh"],
                   "--no_python program './run.sh': is neither a binary nor a script with a #! line, so exec cannot "
                   "run it; begin it with one (#!/bin/sh)"),
    "python-a-script-of-a-missing-interpreter": (
        lambda t: _program(t / "python3", b"#!/opt/nowhere/python3\n"), ["--python", "./python3", "hello.py"],
        "--python './python3': its #! interpreter '/opt/nowhere/python3' is not an executable file"),
}


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "run"])
@pytest.mark.parametrize("setup, args, line", list(BEFORE_THE_START.values()), ids=list(BEFORE_THE_START))
def test_what_the_preflight_knows_is_one_line_before_any_rank(tmp_path, setup, args, line, dry_run):
    (tmp_path / "hello.py").write_text("print('rank ran')\n")
    setup(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result = run_xrun(*dry_run, *args, cwd=str(tmp_path), timeout=TIME_BOUND)
    assert_one_line_error(result, line)
    assert result.stdout == "" and sorted(tmp_path.rglob("*")) == before  # no rank started, nothing made


def test_the_preflight_says_which_log_path_is_not_writable(tmp_path, monkeypatch):
    # root writes anything: os.access answers as for another user here
    from xrun.common.output import logfiles

    (tmp_path / "logs" / "h" / "rank0").mkdir(parents=True)
    (tmp_path / "logs" / "h" / "rank0" / "stdout.log").write_text("an earlier run's\n")  # renamed at the start
    real_access = os.access
    ours = str(tmp_path / "logs" / "h" / "rank0")
    monkeypatch.setattr(logfiles.os, "access", lambda path, mode, **kw: path != ours and real_access(path, mode))
    with pytest.raises(logfiles.LogFileRefused, match="rank0: is not writable by this user, and the ranks' log files "
                                                      "go in it; choose another --log_dir"):
        logfiles.check_logs(str(tmp_path / "logs"), "h", [0])
    logfiles.check_logs(str(tmp_path / "logs"), "h", [1])  # rank1's folder is to be made in h, which is writable


def test_the_agents_preflight_enters_the_spec_working_directory_or_names_it(tmp_path, monkeypatch):
    from xrun.common.preflight import PreflightError, check_spec
    from xrun.common.spec import NodeSpec, RankSpec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "t.py").write_text("")
    rank = RankSpec(rank=0, local_rank=0, env={}, argv=(sys.executable, "-u", "t.py"))
    check_spec(NodeSpec(host="h", node_rank=0, ranks=(rank,), cwd=str(tmp_path / "work")))
    assert os.getcwd() == str(tmp_path / "work")
    gone = str(tmp_path / "gone")
    with pytest.raises(PreflightError) as err:
        check_spec(NodeSpec(host="h", node_rank=0, ranks=(rank,), cwd=gone))
    assert str(err.value) == (f"working directory '{gone}': no such file or directory on this node; xrun runs the "
                              "ranks in the directory it was started in: make it on every node, or start xrun in one "
                              "that every node has")
    assert err.value.exit_code == 2


def test_the_agents_preflight_refuses_what_exec_cannot_take_and_elastic_without_torch(tmp_path, monkeypatch):
    from xrun.common import preflight
    from xrun.common.preflight import PreflightError, check_ranks
    from xrun.common.spec import ElasticOptions, NodeSpec, RankSpec

    rank = RankSpec(rank=0, local_rank=0, env={}, argv=(sys.executable, "-u", "t.py"))
    check_ranks(NodeSpec(host="h", node_rank=0, ranks=(rank,), env={"FINE": "x" * 131_000}))
    # an env file's value of 200 KB travelled to the node; its ranks died of E2BIG (code 126)
    with pytest.raises(PreflightError, match=r"^environment variable 'BIG': is 200,004 bytes, over the 131,071 that "
                                             r"exec takes in one string; pass it in a file instead$"):
        check_ranks(NodeSpec(host="h", node_rank=0, ranks=(rank,), env={"BIG": "x" * 200_000}))
    many = {f"V{i}": "x" * 100_000 for i in range(os.sysconf("SC_ARG_MAX") // 100_000 + 1)}
    with pytest.raises(PreflightError, match=r"^the ranks' command line and environment '\d+ strings': [\d,]+ bytes "
                                             r"are over exec's limit of [\d,]+ \(ARG_MAX"):
        check_ranks(NodeSpec(host="h", node_rank=0, ranks=(rank,), env=many))
    elastic = NodeSpec(host="h", node_rank=0, ranks=(rank,), elastic=ElasticOptions(min_nodes=1, max_nodes=1))
    check_ranks(elastic)  # torch is installed here
    monkeypatch.setattr(preflight, "find_spec", lambda name: None)
    with pytest.raises(PreflightError, match="cannot import torch here, and torch's elastic agent runs the ranks; "
                                             "install torch on every node"):
        check_ranks(elastic)


def test_an_unreadable_hostfile_says_so(tmp_path, monkeypatch):
    from xrun.runner.hosts import hostfile

    def denied(path, limit):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(hostfile, "read_regular_bytes", denied)
    with pytest.raises(XrunError, match="hf: is not readable \\(permission denied\\)$"):
        hostfile.read_hostfile("hf")


def test_a_log_dir_another_node_makes_at_the_same_time_is_no_error(tmp_path, monkeypatch):
    # nodes on one shared filesystem run the same preflight at once: one makes the directory between another's
    # check and its mkdir
    from xrun.common import preflight

    target = tmp_path / "logs" / "run"
    real_mkdir = os.mkdir

    def racing_mkdir(path, *args):
        real_mkdir(path, *args)  # "the other agent" was first
        raise FileExistsError(17, "File exists", path)

    monkeypatch.setattr(preflight.os, "mkdir", racing_mkdir)
    preflight.check_log_dir(str(target))
    assert target.is_dir()  # not ours to remove: the other agent's


def test_a_log_dir_another_node_makes_and_removes_meanwhile_is_no_error(tmp_path, monkeypatch):
    """CI saw it with pdsh (all agents at once): another agent's check made the directory and removed it again
    between this agent's look and its mkdir; it was said to exist and not be a directory, and the job ended."""
    from xrun.common import preflight

    target = tmp_path / "logs"
    real_mkdir, raced = os.mkdir, []

    def made_and_removed_meanwhile(path, *args):
        if not raced:
            raced.append(path)
            raise FileExistsError(17, "File exists", path)  # it was there a moment ago, and is gone now
        real_mkdir(path, *args)

    monkeypatch.setattr(preflight.os, "mkdir", made_and_removed_meanwhile)
    preflight.check_log_dir(str(target))
    assert raced and not target.exists()  # made on the second try, then removed: the check leaves nothing


def test_a_log_dir_that_is_a_file_or_a_dangling_link_is_named(tmp_path, monkeypatch):
    from xrun.common import preflight

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "alink").symlink_to(tmp_path / "nowhere")
    for name in ("afile", "alink"):
        with pytest.raises(XrunError, match=f"^--log_dir: '{name}' exists and is not a directory$"):
            preflight.check_log_dir(name)
    with pytest.raises(XrunError, match="^--log_dir: 'afile' exists and is not a directory$"):
        preflight.check_log_dir("afile/run")  # an ancestor that is a file is named itself
    assert (tmp_path / "afile").read_text() == "x" and not (tmp_path / "nowhere").exists()
