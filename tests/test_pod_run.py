"""Pod mode end to end on this machine: three xrun processes, one per "node" (127.0.0.1-3), each started by
hand with its own --node_rank, as Kubernetes or a person starts them (xrun.joined.pod). No cluster needed.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests.cluster.harness import processes_with_marker
from tests.conftest import ROOT
from tests.labels import expand
from tests.test_metrics import scrape

pytestmark = pytest.mark.slow

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
# A rank sleeps SLEEP seconds (FAIL_NODE's: a short while, then exits FAIL_CODE) and names itself.
SCRIPT = """
import os, sys, time
mine = os.environ.get("FAIL_NODE") == os.environ["GROUP_RANK"]
print("rank", os.environ["RANK"], "token", os.environ.get("XRUN_TOKEN"), flush=True)
time.sleep(0.3 if mine else float(os.environ.get("SLEEP", "0.3")))
sys.exit(int(os.environ.get("FAIL_CODE", "0")) if mine else 0)
"""


def _free_port():
    """A free port below the kernel's ephemeral range: the outgoing sockets of other tests (a flood of 1,500 in
    tests/test_channel_attacks.py) take and linger on ephemeral ports, which a port from bind(0) may be next."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))  # noqa: S104 - free on every address, as node 0's checks need
            except OSError:
                continue
            return port


class Pod:
    """Three nodes' xrun processes, started one by one; ``finish`` waits for them all."""

    def __init__(self, tmp_path, *, join_timeout=20, env=None):
        self.tmp = tmp_path
        (tmp_path / "hosts").write_text("".join(f"{h} slots=1\n" for h in HOSTS))
        (tmp_path / "train.py").write_text(SCRIPT)
        (tmp_path / "other.py").write_text(SCRIPT)
        self.ports = (_free_port(), _free_port())
        self.join_timeout = join_timeout
        self.marker = f"XRUN_POD_TEST={uuid.uuid4().hex}"
        self.env = {**os.environ, "PYTHONPATH": ROOT, self.marker.split("=")[0]: self.marker.split("=")[1],
                    **(env or {})}
        self.env.pop("XRUN_TOKEN", None) if "XRUN_TOKEN" not in (env or {}) else None
        self.procs = {}

    def start(self, node, *, script="train.py", env=None, control_port=None, wrap=(), where=None, options=(),
              **popen):
        where = ["-H", str(self.tmp / "hosts")] if where is None else where
        argv = [*wrap, sys.executable, "-m", "xrun", *where, *options, "--pod", "--node_rank", str(node),
                "--master_port", str(self.ports[0]), "--control_port", str(control_port or self.ports[1]),
                "--join_timeout", str(self.join_timeout), script]
        self.procs[node] = subprocess.Popen(argv, env={**self.env, **(env or {})}, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, errors="surrogateescape",
                                            cwd=str(self.tmp), **popen)
        return self.procs[node]

    def finish(self, timeout=60):
        out = {}
        for node, proc in self.procs.items():
            stdout, stderr = proc.communicate(timeout=timeout)
            out[node] = (proc.returncode, stdout, stderr)
        assert _gone(self.marker), "processes of the job are left"
        return out


def _ranks(marker):
    """The job's rank processes: the ones xrun gave ``--local_rank=N`` (not the xruns, not their watchdogs)."""
    ranks = []
    for pid in processes_with_marker(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--local_rank=" in f.read():
                    ranks.append(pid)
        except OSError:
            pass
    return ranks


def _gone(marker, timeout=5.0):
    deadline = time.monotonic() + timeout
    while processes_with_marker(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_three_nodes_succeed_and_no_rank_sees_the_token(tmp_path):
    pod = Pod(tmp_path, env={"XRUN_TOKEN": "s3cret-0123456789ab", "SLEEP": "3"})
    metrics = _free_port()
    for node in (0, 1, 2):  # the same command line on every node: node 0 alone serves --metrics_port (issue 40)
        pod.start(node, options=("--metrics_port", str(metrics)))
    deadline, running = time.monotonic() + 30, None
    while running != 3 and time.monotonic() < deadline:
        try:
            running = scrape(metrics).get(("xrun_ranks", frozenset({("state", "running")})))
        except OSError:
            pass  # not listening yet
        time.sleep(0.1)
    out = pod.finish()
    assert running == 3
    for node, (code, stdout, stderr) in out.items():
        assert code == 0, stderr
        assert f"rank {node} token None" in stdout
        assert "not authenticated" not in stderr
        assert "3/3 nodes ready" in stderr


def test_node_0_started_last_completes(tmp_path):
    pod = Pod(tmp_path)
    pod.start(1)
    pod.start(2)
    time.sleep(2.5)
    pod.start(0)
    out = pod.finish()
    assert [code for code, _, _ in out.values()] == [0, 0, 0], out
    assert "node 0's control channel at 127.0.0.1" in out[1][2] and "not up yet" in out[1][2]
    assert "not authenticated" in out[0][2]
    # no secret: every node says once, at start, who can join or end the job, and the fix
    warning = "xrun: WARNING: no --token_file and no XRUN_TOKEN: the control channel is not authenticated: anyone " \
              "who can reach node 0's control port can join this job or end it; fix: kubectl create secret generic " \
              "xrun-token"
    for _, _, stderr in out.values():
        assert stderr.count(warning) == 1 and stderr.index(warning) < stderr.index("nodes ready"), stderr


def test_a_short_secret_is_refused_before_anything_starts(tmp_path):
    pod = Pod(tmp_path, env={"XRUN_TOKEN": "1234"})
    proc = pod.start(1)
    out = pod.finish(timeout=30)
    code, stdout, stderr = out[1]
    assert code == 2 and stdout == "" and proc.returncode == 2
    assert stderr == "xrun: XRUN_TOKEN: the shared secret is 4 character(s) long, at least 16 are needed (a short " \
                     "one is guessed in seconds); make one with `openssl rand -hex 32`\n"


def test_a_missing_node_is_named_by_every_started_node(tmp_path):
    pod = Pod(tmp_path, join_timeout=4)
    started = time.monotonic()
    pod.start(0)
    pod.start(1)
    out = pod.finish()
    assert time.monotonic() - started < 4 + 10
    for code, _, stderr in out.values():
        assert code == 1, stderr
        assert "not ready within --join_timeout 4 s: 127.0.0.3" in stderr


def test_a_failing_rank_on_node_2_stops_every_node_with_its_code(tmp_path):
    pod = Pod(tmp_path, env={"FAIL_NODE": "2", "FAIL_CODE": "7", "SLEEP": "60"})
    for node in (0, 1, 2):
        pod.start(node)
    started = time.monotonic()
    out = pod.finish()
    assert time.monotonic() - started < 20
    assert [code for code, _, _ in out.values()] == [7, 7, 7], out
    assert "job failed: rank 2 (local 0) on 127.0.0.3 exited with code 7" in out[0][2]
    assert "(exit code 7)" not in out[0][2]  # the code said once
    assert "on 127.0.0.3 exited with code 7" in out[1][2]


def test_sigterm_to_node_1_stops_the_job_everywhere(tmp_path):
    pod = Pod(tmp_path, env={"SLEEP": "60"})
    for node in (0, 1, 2):
        pod.start(node)
    proc = pod.procs[1]
    deadline = time.monotonic() + 20
    while len(_ranks(pod.marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)  # every node's rank runs (a count of all the job's processes also counts watchdog forks)
    proc.send_signal(signal.SIGTERM)
    out = pod.finish(timeout=30)
    assert [code for code, _, _ in out.values()] == [143, 143, 143], out
    assert "127.0.0.2" in out[0][2]


def test_a_node_with_another_script_is_refused_by_name(tmp_path):
    pod = Pod(tmp_path)
    pod.start(0)
    pod.start(1)
    time.sleep(2.0)  # both joined: a node that comes after the job ended finds no node 0 to tell it why
    pod.start(2, script="other.py")
    out = pod.finish()
    assert [code for code, _, _ in out.values()] == [2, 2, 2], out
    for node in (0, 2):
        assert "node 2 (127.0.0.3) runs another job: 127.0.0.3 runs" in out[node][2]
        assert "127.0.0.3 runs other.py; node 0 runs train.py" in out[node][2]


def test_a_planted_link_in_a_shared_log_dir_ends_the_job_with_2_on_every_node_before_any_rank(tmp_path):
    # issue 33 §2: node 1's preflight (once it joined node 0) finds the link where its rank's stdout.log goes; the
    # job ends with 2 everywhere, at once, naming the path, and no rank anywhere started
    logs = tmp_path / "logs"
    (logs / "127.0.0.2" / "rank1").mkdir(parents=True)
    (logs / "127.0.0.2" / "rank1" / "stdout.log").symlink_to(tmp_path / "elsewhere")
    pod = Pod(tmp_path, join_timeout=60)
    for node in (0, 2):
        pod.start(node, options=("--log_dir", str(logs)))
    time.sleep(2.0)  # both joined: a node that comes after the job ended finds no node 0 to tell it why
    started = time.monotonic()
    pod.start(1, options=("--log_dir", str(logs)))
    out = pod.finish()
    assert time.monotonic() - started < 20  # not the --join_timeout
    assert [code for code, _, _ in out.values()] == [2, 2, 2], out
    refused = f"--log_dir '{logs}/127.0.0.2/rank1/stdout.log': is a symbolic link where this rank's log file goes"
    for code, stdout, stderr in out.values():
        assert "token" not in stdout and "Traceback" not in stderr, stderr  # no rank printed its line
        assert refused in stderr, stderr
    assert not (tmp_path / "elsewhere").exists() and not (logs / "127.0.0.1" / "rank0").exists()


def test_a_node_with_the_wrong_token_says_so(tmp_path):
    pod = Pod(tmp_path, join_timeout=5, env={"XRUN_TOKEN": "right-0123456789abcdef"})
    pod.start(0)
    pod.start(1)
    pod.start(2, env={"XRUN_TOKEN": "wrong-0123456789abcdef"})
    out = pod.finish()
    assert out[2][0] == 1
    said = "node 0 could not prove this job's secret: is XRUN_TOKEN/--token_file the same on every node?"
    assert said in out[2][2]
    for node in (0, 1):
        assert out[node][0] == 1 and "not ready within --join_timeout 5 s: 127.0.0.3" in out[node][2]
    assert "closed 1 connection(s) that did not prove this run's key" in out[0][2]


def test_dry_run_shows_the_pod_plan_and_whether_the_channel_is_authenticated(tmp_path):
    pod = Pod(tmp_path)
    argv = [sys.executable, "-m", "xrun", "-H", str(tmp_path / "hosts"), "--pod", "--node_rank", "1",
            "--control_port", "29999", "--dry-run", "train.py"]
    plain = subprocess.run(argv, env=pod.env, capture_output=True, text=True, cwd=str(tmp_path), timeout=30)
    assert "pod: node 1 of 3, control 127.0.0.1:29999, plan digest " in plain.stdout
    assert "unauthenticated (no token)" in plain.stdout
    secret = subprocess.run(argv, env={**pod.env, "XRUN_TOKEN": "s3cret-0123456789ab"}, capture_output=True, text=True,
                            cwd=str(tmp_path), timeout=30)
    assert "authenticated by the shared token" in secret.stdout and "s3cret" not in secret.stdout


SHARED = r"""
import os, sys
rank = os.environ["RANK"]
print("every rank says this", flush=True)
sys.stdout.buffer.write(b"own \xff " + rank.encode() + b"\n")
sys.stdout.flush()
print("every rank on stderr", file=sys.stderr, flush=True)
"""


def test_node_0_shows_every_nodes_lines_merged_and_each_node_its_own(tmp_path):
    pod = Pod(tmp_path)
    (tmp_path / "train.py").write_bytes(SHARED.encode())
    for node in (0, 1, 2):
        pod.start(node)
    out = {node: (code, stdout.encode("utf-8", "surrogateescape"), stderr)
           for node, (code, stdout, stderr) in pod.finish().items()}
    assert [out[n][0] for n in (0, 1, 2)] == [0, 0, 0], out
    node0 = out[0][1].splitlines()
    # once across the nodes; under heavy load a node's rank may print past the late window: two groups then
    shared = [line for line in node0 if line.endswith(b"] every rank says this")]
    assert shared[0].startswith(b"[ranks ") and len(shared) <= 2, node0
    assert sorted(r for line in shared for r in expand(line[1:line.index(b"]")].decode().rsplit(" ", 1)[-1]
                                                       .rsplit(":", 1)[-1])) == [0, 1, 2], node0
    for rank, host in enumerate(HOSTS):
        assert node0.count(f"[{host}:{rank}] own ".encode() + b"\xff " + str(rank).encode()) == 1, node0  # raw bytes
        if rank:  # every other node's console (its pod's log) keeps its own ranks' lines
            assert out[rank][1].splitlines().count(f"[{host}:{rank}] every rank says this".encode()) == 1
    assert "] every rank on stderr" in out[0][2] and out[0][2].count("] every rank on stderr") <= 2



def test_numbered_pods_go_by_the_host_names_they_report(tmp_path):
    """A platform that gives a node count but no names (seed 001's PyTorchJob variables): the nodes are numbered
    until they join, then named by the host name each reports, in prefixes and reports (issue 25 §6). Each node runs
    in a UTS namespace of its own, named off by one from its index as the seed's pods were."""
    pod = Pod(tmp_path, env={"FAIL_NODE": "2", "FAIL_CODE": "7", "SLEEP": "60"})
    for node in (0, 1, 2):
        name = f"train-worker-{node + 1}"
        pod.start(node, wrap=["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name],
                  where=["--num_nodes", "3", "--master_addr", "127.0.0.1"])
    out = pod.finish()
    assert [code for code, _, _ in out.values()] == [7, 7, 7], out
    assert "job failed: rank 2 (local 0) on train-worker-3 exited with code 7" in out[0][2], out[0][2]
    assert "node2" not in out[0][2] and "node 2" not in out[0][2], out[0][2]
    for node in (0, 1, 2):
        assert f"[train-worker-{node + 1}:{node}] rank {node} token None" in out[node][1], out[node]


# A rank that ignores SIGTERM: the stop for a lost node then waits out --shutdown_timeout, and a Ctrl-C arrives.
STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("rank", os.environ["RANK"], "up", flush=True)
time.sleep(120)
"""


def test_a_ctrl_c_while_stopping_for_a_lost_node_names_the_loss_first_then_the_interrupt(tmp_path):
    """Issue 37 §4: node 1's xrun is killed (node lost), node 0 stops its rank (which ignores SIGTERM, so the stop
    waits for --shutdown_timeout), and SIGINT reaches node 0's xrun meanwhile: the end line and summary.json say the
    node was lost first, then that the user interrupted, and the job keeps the loss's exit code, 1."""
    pod = Pod(tmp_path)
    (tmp_path / "hosts").write_text("127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    options = ("--shutdown_timeout", "6", "--log_dir", "logs")
    for node in (0, 1):
        pod.start(node, script="stubborn.py", options=options)
    deadline = time.monotonic() + 30
    while len(_ranks(pod.marker)) < 2:
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)
    pod.procs[1].kill()  # node 1 is lost: its agent's connection drops
    time.sleep(1.5)  # node 0 notices at once and stops its rank, which takes the whole --shutdown_timeout
    assert pod.procs[0].poll() is None
    pod.procs[0].send_signal(signal.SIGINT)
    out = pod.finish(timeout=60)
    code, _, stderr = out[0]
    assert code == 1, stderr
    assert out[1][0] == -signal.SIGKILL
    assert "got SIGINT; already stopping every node" in stderr, stderr
    end = [line for line in stderr.splitlines() if line.startswith("xrun: job failed")]
    assert len(end) == 1, stderr
    assert end[0].startswith("xrun: job failed: lost node 127.0.0.2: "), end
    assert " (exit code 1), then stopped by SIGINT while stopping every node; every node stopped " in end[0], end
    assert "stopped by SIGINT (exit code 130)" not in stderr
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert summary["exit_code"] == 1 and summary["end"] == end[0].removeprefix("xrun: ")
    assert summary["root_cause"]["host"] == "127.0.0.2" and summary["root_cause"]["exit_code"] == 1
    assert summary["root_cause"]["reason"].startswith("lost node 127.0.0.2: ")
    assert summary["interrupted_by"] == {"number": 2, "name": "SIGINT"}
