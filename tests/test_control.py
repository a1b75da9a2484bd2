"""The runner's control server with real agents started locally (no ssh): auth, barrier, failure, timeouts."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from tests.conftest import ROOT
from tests.headserver import console_of
from xrun import channel
from xrun.common.output.status import PlainStatus
from xrun.common.rankplan import LaunchOptions
from xrun.runner.backends.channel import Endpoint, agent_connect_argv
from xrun.runner.job.control_server import ControlServer
from xrun.runner.job.gate import Gate
from xrun.runner.job.keys import NodeKeys
from xrun.runner.plan import JobRequest, make_plan

RANK = """
import os, sys, time
print("R", os.environ["RANK"], os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], os.environ.get("SECRET"))
if os.environ["RANK"] == os.environ.get("FAIL_RANK"):
    sys.exit(7)
time.sleep(float(os.environ.get("SLEEP", "0")))
"""


class LocalSessions:
    """Agents as local subprocesses, the token on stdin like the ssh backend."""

    def __init__(self, plan, endpoint, skip=()):
        self.procs = {}
        for node in plan.nodes:
            if node.host in skip:
                continue
            argv = agent_connect_argv(sys.executable, endpoint, str(node.node_rank), token_on_stdin=True)
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    cwd=ROOT)
            proc.stdin.write(endpoint.token.encode() + b"\n")
            proc.stdin.close()
            self.procs[node.host] = proc
        self.output = {}
        self.readers = []

    def register(self, loop):
        for host, proc in self.procs.items():
            reader = threading.Thread(target=lambda h=host, p=proc: self.output.__setitem__(h, p.stdout.read()),
                                      daemon=True)
            reader.start()
            self.readers.append(reader)

    def finished(self, lost):
        return all(p.poll() is not None for p in self.procs.values())

    def terminate(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
            proc.wait()
        # An agent that has exited may still have output in its pipe: the reader thread stores it at EOF, and a
        # test that read ``output`` before then lost a whole node's lines (seen in a full CI run).
        for reader in self.readers:
            reader.join(10)


def run_job(tmp_path, env, *, skip=(), join_timeout=30.0, master_port=0, before=None, in_thread=False):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    world = {"a": (0, 1), "b": (0,), "c": (0,)}
    request = JobRequest(script=str(script), master_port=master_port, launch=LaunchOptions(python=sys.executable),
                         env=env, cwd=str(tmp_path))
    plan = make_plan(request, world, "ssh")
    gate = Gate(NodeKeys.shared_secret(3, "t0ken"), nodes=3, prove_server=False)
    server = ControlServer(plan, gate, join_timeout=join_timeout, status=PlainStatus(3))
    shown = console_of(server)
    port = server.listen(["127.0.0.1"])
    if before:
        before(port)
    sessions = LocalSessions(plan, Endpoint("127.0.0.1", port, "t0ken", gate.fingerprint), skip=skip)
    started = time.monotonic()
    if in_thread:
        codes = []
        thread = threading.Thread(target=lambda: codes.append(server.run(sessions, own_signals=False)))
        thread.start()
        thread.join(60)
        code = codes[0]
    else:
        code = server.run(sessions)
    sessions.terminate()
    out = b"".join([*shown, *(sessions.output.get(h, b"") for h in world)]).decode()
    return code, out, server, time.monotonic() - started


def test_barrier_master_port_and_env(tmp_path):
    code, out, server, _ = run_job(tmp_path, {"SECRET": "x y\n$z"})
    assert code == 0, out
    lines = [line.split(" ", 1)[1] for line in out.splitlines() if " R " in line]
    assert len(lines) == 4
    ports = {line.split()[3] for line in lines}
    assert len(ports) == 1 and ports != {"0"}  # node 0 picked one free port for everybody
    assert all(line.split()[2] == "a" for line in lines)  # node 0's address is loopback here: its name instead


def test_the_loop_runs_off_the_main_thread_without_taking_signals(tmp_path):
    """Pod mode's shape: node 0's xrun serves the channel from a thread; the main thread keeps its handlers."""
    handler = signal.getsignal(signal.SIGTERM)
    code, out, _, _ = run_job(tmp_path, {}, in_thread=True)
    assert code == 0, out
    assert signal.getsignal(signal.SIGTERM) is handler


def test_first_failure_stops_everything_fast(tmp_path):
    code, out, server, _ = run_job(tmp_path, {"FAIL_RANK": "2", "SLEEP": "30"})
    assert code == 7
    assert server.failure.host == "b" and server.failure.rank == 2
    assert server.all_over_at - server.failure_at < 1.0


def test_join_timeout_names_missing_hosts(tmp_path, capsys):
    code, _, server, elapsed = run_job(tmp_path, {}, skip=("c",), join_timeout=1.5)
    assert code == 1 and elapsed < 10
    assert "not ready within --join_timeout 1.5 s: c" in server.failure.reason


def test_stray_connection_gets_nothing(tmp_path):
    answers = []

    def stray(port):
        def go():
            with socket.create_connection(("127.0.0.1", port)) as sock:
                bad = channel.message(channel.Kind.HELLO, token="guess", node_rank=0, host="evil", pid=1)
                sock.sendall(channel.encode(bad))
                sock.settimeout(5)
                answers.append(sock.recv(65536))  # b"" = closed without a byte

        threading.Thread(target=go, daemon=True).start()
        time.sleep(0.2)

    code, out, server, _ = run_job(tmp_path, {}, before=stray)
    assert code == 0, out
    assert answers == [b""] and server.strays == 1


def test_garbage_before_hello_is_dropped(tmp_path):
    def junk(port):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"\xff\xff\xff\xffGET / HTTP/1.0\r\n\r\n")
            time.sleep(0.1)

    code, out, _, _ = run_job(tmp_path, {}, before=junk)
    assert code == 0, out


def test_env_of_agent_process_not_in_argv(tmp_path):
    """The secret reaches the rank's environment, never any command line (checked while running)."""
    seen = []

    def spy(port):
        def go():
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not seen:
                for pid in os.listdir("/proc"):
                    try:
                        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
                        environ = open(f"/proc/{pid}/environ", "rb").read()
                    except OSError:
                        continue
                    if b"SECRET=s3cr3t-value" in environ.split(b"\0"):
                        seen.append(cmdline)
                time.sleep(0.05)

        threading.Thread(target=go, daemon=True).start()

    code, _, _, _ = run_job(tmp_path, {"SECRET": "s3cr3t-value", "SLEEP": "1"}, before=spy)
    assert code == 0 and seen
    assert not any(b"s3cr3t" in cmdline for cmdline in seen)
