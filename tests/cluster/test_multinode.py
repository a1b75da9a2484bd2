"""xrun across real hosts (network-namespace nodes with sshd), with both fan-out backends: ssh and pdsh.

Each job's ranks carry an env marker (XRUN_TEST_MARK=<uuid>) so "nothing of the job is left on any node" is
checked by environment, never by name; the agents (which do not carry it) are checked through the nodes'
process lists against what ran there before the job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT
from xrun.runner import envpass

BACKENDS = ["ssh", "pdsh"]
MARK = "XRUN_TEST_MARK"

RANK_SCRIPT = r"""
import json, os, socket, sys, time
keys = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "WEIRD", "FROM_FILE", "NCCL_FAKE_SETTING", "PYTHONPATH"]
record = {k: os.environ.get(k) for k in keys}
record.update(host=socket.gethostname(), args=sys.argv[1:], cwd=os.getcwd())
print(json.dumps(record), flush=True)
if os.environ["RANK"] == os.environ.get("FAIL_RANK"):
    time.sleep(0.2)
    sys.exit(int(os.environ.get("FAIL_CODE", "1")))
time.sleep(float(os.environ.get("SLEEP", "0")))
"""

ALLREDUCE_SCRIPT = r"""
import os, socket, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
# the agent's store on rank 0's node (issue 39 §1), opened by hand as torchft's Manager does
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
if dist.get_rank() == 0:
    store.set("set by rank 0 on", socket.gethostname())
print("SUM", dist.get_rank(), socket.gethostname(), int(t.item()), store.get("set by rank 0 on").decode(), flush=True)
dist.destroy_process_group()
# torch 2.13's gloo can abort at interpreter teardown after a clean destroy_process_group() (examples/train_ddp.py):
# the work is done and flushed, so leave without those destructors; xrun's handling of a crash is tested elsewhere
sys.stderr.flush()
os._exit(0)
"""

WEIRD_ENV = "s3cr3t-9f1e sp ace 'sq' \"dq\" $(touch /tmp/xrun-pwned) `id` $HOME \\back\nnew line ünï ✓ #nc"


@pytest.fixture
def job(cluster, tmp_path):
    """Run xrun against the cluster from a scratch working directory; returns a runner."""
    (tmp_path / "home").mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=2)
    mark = uuid.uuid4().hex
    baseline = {node.name: set(cluster.pids(node)) for node in cluster.nodes}

    def start(backend, *args, env=None, script_path=script, script_args=(), **popen):
        full_env = dict(os.environ, HOME=str(tmp_path / "home"), PYTHONPATH=ROOT, **{MARK: mark}, **(env or {}))
        full_env.pop("CUDA_VISIBLE_DEVICES", None)
        # Variables of the test's own choosing travel with --export; NCCL_*/GLOO_*/TORCH_* travel by prefix.
        exports = [f"--export={name}" for name in (env or {}) if not name.startswith(envpass.PREFIXES)]
        argv = [sys.executable, "-m", "xrun", "-H", str(hostfile), "--launcher", backend,
                "--ssh_config", str(cluster.ssh_config), "--export", MARK, *exports, *args, str(script_path),
                *script_args]
        return subprocess.Popen(argv, cwd=tmp_path, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, **popen)

    def run(backend, *args, env=None, timeout=60, **kw):
        proc = start(backend, *args, env=env, **kw)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err

    def leftovers():
        ranks = cluster.processes_with_marker(f"{MARK}={mark}")
        # An sshd session to a node that is cut off lingers until TCP gives up: it is ssh's, not the job's.
        others = {n.name: sorted(p for p in set(cluster.pids(n)) - baseline[n.name] if _comm(p) != "sshd")
                  for n in cluster.nodes}
        return ranks, {k: v for k, v in others.items() if v}

    def assert_clean(timeout=15.0):
        deadline = time.monotonic() + timeout
        while True:
            ranks, others = leftovers()
            if not ranks and not others:
                return
            if time.monotonic() > deadline:
                described = {pid: _cmdline(pid) for pid in ranks + [p for v in others.values() for p in v]}
                raise AssertionError(f"left behind: ranks {ranks}, node processes {others}: {described}")
            time.sleep(0.05)

    return SimpleNamespace(start=start, run=run, assert_clean=assert_clean, tmp=tmp_path, mark=mark, cluster=cluster)


def _comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


def records(stdout):
    out = {}
    for line in stdout.splitlines():
        prefix, _, body = line.partition("] ")
        if body.startswith("{"):
            out[prefix + "]"] = json.loads(body)
    return out


def wait_for_ranks(proc_out_lines, count, timeout=30):
    deadline = time.monotonic() + timeout
    while len(proc_out_lines) < count:
        assert time.monotonic() < deadline, f"only {len(proc_out_lines)} ranks started"
        time.sleep(0.02)


def started_job(job, backend, **env):
    """Start a long job, return (proc, lines) once all 6 ranks printed their record."""
    proc = job.start(backend, env={"SLEEP": "60", **env})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    wait_for_ranks(lines, 6)
    return proc, lines


@pytest.mark.parametrize("backend", BACKENDS)
def test_env_args_and_rank_contract_arrive_exact(job, backend, weird_args):
    (job.tmp / ".xrun_env").write_text('FROM_FILE="f1l3-s3cr3t\\nline2 \\"q\\" \\$x"\n# comment\n\n')
    secret_seen_in_cmdline = []
    stop = threading.Event()

    def scan():  # while the job runs: no command line on any node (or here) contains the secret
        while not stop.is_set():
            for pid in os.listdir("/proc"):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"s3cr3t-9f1e" in cmdline or b"f1l3-s3cr3t" in cmdline:  # env values, never argv
                    secret_seen_in_cmdline.append(cmdline)
            time.sleep(0.02)

    scanner = threading.Thread(target=scan, daemon=True)
    scanner.start()
    try:
        code, out, err = job.run(
            backend, "--no_local_rank", "--log_dir", "logs",
            env={"WEIRD": WEIRD_ENV, "NCCL_FAKE_SETTING": "7", "SLEEP": "0.5"}, script_args=weird_args,
        )
    finally:
        stop.set()
        scanner.join()
    assert code == 0, err
    recs = records(out)
    assert set(recs) == {f"[node{n}:{r}]" for n, r in ((1, 0), (1, 1), (2, 2), (2, 3), (3, 4), (3, 5))}
    for key, rec in recs.items():
        rank = int(key.split(":")[1][:-1])
        assert rec["RANK"] == str(rank) and rec["LOCAL_RANK"] == str(rank % 2) and rec["GROUP_RANK"] == str(rank // 2)
        assert rec["WORLD_SIZE"] == "6" and rec["LOCAL_WORLD_SIZE"] == "2"
        assert rec["host"] == f"node{rank // 2 + 1}"
        assert rec["MASTER_ADDR"] == "10.77.0.11"  # node 1's address on the cluster network
        assert rec["args"] == list(weird_args)
        assert rec["WEIRD"] == WEIRD_ENV and rec["NCCL_FAKE_SETTING"] == "7"
        assert rec["FROM_FILE"] == 'f1l3-s3cr3t\nline2 "q" $x'
        assert rec["cwd"] == str(job.tmp) and rec["PYTHONPATH"].split(":")[0] == str(job.tmp)
    assert not secret_seen_in_cmdline
    assert not os.path.exists("/tmp/xrun-pwned")
    for key, rec in recs.items():  # --log_dir, relative to the working directory, on every node
        host, rank = key[1:-1].split(":")
        assert json.loads((job.tmp / "logs" / host / f"rank{rank}" / "stdout.log").read_text()) == rec
    job.assert_clean()


@pytest.mark.torch
@pytest.mark.parametrize("backend", BACKENDS)
def test_gloo_allreduce_across_nodes(job, backend):
    pytest.importorskip("torch")
    script = job.tmp / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    env = {"GLOO_SOCKET_IFNAME": "xceth0", "TORCH_CPP_LOG_LEVEL": "ERROR"}  # GLOO_*/TORCH_* travel by prefix
    code, out, err = job.run(backend, "--master_port", "0", env=env, script_path=script, timeout=120)
    assert code == 0, err
    sums = sorted(line.split("] ", 1)[1] for line in out.splitlines() if "] SUM " in line)
    expected = sorted(f"SUM {r} node{r // 2 + 1} 21 node1" for r in range(6))  # 1+2+...+6, rank 0's key
    assert sums == expected, out + err
    job.assert_clean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_failing_rank_stops_every_node(job, backend):
    started = time.monotonic()
    code, out, err = job.run(backend, env={"FAIL_RANK": "3", "FAIL_CODE": "7", "SLEEP": "60"})
    assert code == 7, err
    assert time.monotonic() - started < 20
    assert "job failed: rank 3 (local 1) on node2 exited with code 7" in err
    job.assert_clean()


def test_pdsh_keeps_its_echoes_of_the_stop_off_the_console(job):
    # Rank 3 exits 1: xrun stops the other nodes, whose agents exit 143. pdsh -S says "ssh exited with exit code
    # 143" of each: only the echo of xrun's own stop, which reads like a second failure (xrun.runner.backends.echoes).
    code, out, err = job.run("pdsh", env={"FAIL_RANK": "3", "FAIL_CODE": "1", "SLEEP": "60"})
    assert code == 1, err
    assert "job failed: rank 3 (local 1) on node2 exited with code 1" in err
    assert "node node1: stopped by SIGTERM (exit code 143)" in err  # xrun's own word on how each node ended
    assert "ssh exited with exit code 143" not in err, err
    job.assert_clean()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_xrun_stops_every_node(job, backend, signum):
    proc, _ = started_job(job, backend)
    proc.send_signal(signum)
    assert proc.wait(timeout=20) == 128 + signum
    err = proc.stderr.read()
    assert f"stopped by {signal.Signals(signum).name}" in err
    assert "ssh exited with exit code" not in err, err  # pdsh: its echo of the stop is kept off
    job.assert_clean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill9_of_xrun_leaves_no_orphans(job, backend):
    proc, _ = started_job(job, backend)
    proc.kill()
    proc.wait()
    job.assert_clean(timeout=15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_node_ends_the_job_naming_it(job, backend):
    proc, _ = started_job(job, backend)
    job.cluster.kill_node("node2")
    assert proc.wait(timeout=30) != 0
    assert "lost node node2" in proc.stderr.read()
    job.assert_clean()


def node_agent(cluster, node):
    """The pid of the xrun agent on ``node`` (not its watchdog, a fork of it that shares its command line)."""
    agents = [pid for pid in cluster.pids(node) if "xrun.launch" in _cmdline(pid)]
    [agent] = [pid for pid in agents if _parent(pid) not in agents]
    return agent


def _parent(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill9_of_one_nodes_agent_ends_the_job_and_leaves_nothing_on_that_node(job, backend, python):
    script = job.tmp / "errfile.py"  # each rank names its TORCHELASTIC_ERROR_FILE: the agent's per-run directory
    script.write_text('import os, time\nprint("ERRFILE", os.environ["TORCHELASTIC_ERROR_FILE"], flush=True)\n'
                      'time.sleep(60)\n')
    proc = job.start(backend, "--python", python, script_path=script)  # this tree's agent on the nodes
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    wait_for_ranks(lines, 6)
    directories = {line.split("] ", 1)[0][1:].split(":")[0]: os.path.dirname(line.split()[-1]) for line in lines}
    os.kill(node_agent(job.cluster, "node2"), signal.SIGKILL)  # the agent only: its sshd and ranks stay
    assert proc.wait(timeout=20) == 1
    assert "job failed: lost node node2: its agent's connection dropped" in proc.stderr.read()
    job.assert_clean()  # node2's ranks too: its watchdog stopped them
    deadline = time.monotonic() + 5
    while os.path.exists(directories["node2"]):  # the watchdog removes the directory the dead agent cannot
        assert time.monotonic() < deadline, f"{directories['node2']} left behind on node2"
        time.sleep(0.05)
    assert not any(os.path.exists(d) for d in directories.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_frozen_agent_ends_the_job_within_the_keepalive_bound_and_its_ranks_go_too(job, backend, python):
    proc = job.start(backend, "--python", python, env={"SLEEP": "60"})  # this tree's agent on the nodes
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    wait_for_ranks(lines, 6)
    agent = node_agent(job.cluster, "node2")
    os.kill(agent, signal.SIGSTOP)  # frozen, its socket open: only the silence tells
    frozen = time.monotonic()
    try:
        assert proc.wait(timeout=30) == 1
        assert time.monotonic() - frozen < 14  # 10 s of silence, a ping round, the stop
        assert "job failed: lost node node2: no word from its agent for 10 s" in proc.stderr.read()
        deadline = time.monotonic() + 5
        # The agent is still frozen; its watchdog heard no beat for as long and stopped node2's ranks (they would
        # otherwise run on beside a hot spare that took their place).
        while job.cluster.processes_with_marker(f"{MARK}={job.mark}"):
            assert time.monotonic() < deadline, "the frozen agent's ranks are still running"
            time.sleep(0.05)
    finally:
        os.kill(agent, signal.SIGKILL)
    job.assert_clean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cut_node_ends_the_job_and_its_ranks(job, backend):
    proc, _ = started_job(job, backend)
    noticed: list[float] = []  # when the head's console first names the lost node

    def watch():
        for line in iter(proc.stderr.readline, ""):
            if "lost node node3" in line and not noticed:
                noticed.append(time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    job.cluster.cut("node3")
    started = time.monotonic()
    assert proc.wait(timeout=40) != 0
    ended = time.monotonic()
    watcher.join(5)
    assert ended - started < 25  # keepalive bound: ~10 s silence, plus the stop
    assert noticed, "the head never named node3"
    # Once the job names the lost node it ends at once: the head does not wait for the session of the node it
    # gave up on (pdsh's ssh to it stays open until TCP gives up; it once cost pdsh runs a 3 s linger).
    assert ended - noticed[0] < 1.5, f"exited {ended - noticed[0]:.2f} s after naming the lost node"
    job.assert_clean(timeout=20)  # the cut node's agent notices the silence too and stops its ranks


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_planted_link_in_a_shared_log_dir_is_one_line_exit_2_and_no_rank_starts(job, backend, python):
    # issue 33 §2: the nodes share --log_dir; a link sits where node2's rank 3 writes its stdout.log. It was rank 3
    # failing with 126 and a failure table; node2's preflight refuses it before the barrier, the job ends with 2
    logs = job.tmp / "logs"
    link = logs / "node2" / "rank3" / "stdout.log"
    link.parent.mkdir(parents=True)
    link.symlink_to(job.tmp / "must-not-appear")
    code, out, err = job.run(backend, "--python", python, "--log_dir", str(logs), env={"SLEEP": "30"})
    assert code == 2, err
    assert records(out) == {} and not (job.tmp / "must-not-appear").exists()  # no rank started anywhere
    refused = (f"xrun: job failed: --log_dir '{link}': is a symbolic link where this rank's log file goes (xrun writes "
               "only files it creates); remove it or choose another --log_dir (exit code 2); every node stopped ")
    assert [line for line in err.splitlines() if line.startswith(refused)] == [err.splitlines()[-1]], err
    # The head's own race, not the refusal's: an agent that connects after node2's refusal began the stop is turned
    # away without a word, and says so (pdsh: its exit too). Nothing else may be said.
    late = ("xrun: turned away node ", "xrun.launch[node", "pdsh@")
    assert all(line.startswith(late) for line in err.splitlines()[:-1]), err
    assert list(logs.glob("node*/rank*/*.log")) == [link]
    job.assert_clean()


def test_unreachable_host_named_and_nothing_started(job):
    job.cluster.kill_node("node3")
    code, out, err = job.run("ssh", env={"SLEEP": "30"})
    assert code == 255
    assert "node3" in err and "node1" not in err.split("cannot start on")[-1]
    job.assert_clean()


def test_pdsh_unreachable_host_named_in_pdshs_words(job):
    job.cluster.kill_node("node3")
    code, out, err = job.run("pdsh", env={"SLEEP": "30"})
    assert code == 255, err
    assert "the session to node3 exited with code 255 before its agent connected" in err
    assert "pdsh@" in err and "node3: ssh exited with exit code 255" in err, err  # ssh's own failure: shown
    job.assert_clean()


def test_unknown_host_key_refused_unless_accepted(job, tmp_path):
    config = tmp_path / "ssh_config_no_known_hosts"
    text = job.cluster.ssh_config.read_text()
    config.write_text(text.replace(str(job.cluster.known_hosts), str(tmp_path / "empty_known_hosts")))
    code, out, err = job.run("ssh", "--ssh_config", str(config))
    assert code == 255 and "not in known_hosts" in err and "--ssh_accept_new_hosts" in err
    code, out, err = job.run("ssh", "--ssh_config", str(config), "--ssh_accept_new_hosts")
    assert code == 0, err
    job.assert_clean()


def test_check_reports_a_consistent_cluster(job):
    hostfile = job.tmp / "hosts"
    result = subprocess.run([sys.executable, "-m", "xrun", "check", "-H", str(hostfile), "--ssh_config",
                             str(job.cluster.ssh_config)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "master node1: port 29500 free" in result.stdout
    job.cluster.kill_node("node2")
    result = subprocess.run([sys.executable, "-m", "xrun", "check", "-H", str(hostfile), "--ssh_config",
                             str(job.cluster.ssh_config)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1 and "node2" in result.stderr
