"""xrun through the engines a cluster already runs: OpenMPI's mpirun, MPICH's hydra, Intel MPI's hydra and
Slurm's srun (slurmctld + one slurmd per node, munge), on the network-namespace nodes.

Checks, per engine: the rank contract and node order (a hostfile deliberately not in sorted order), weird
user args and env values arriving byte-exact with no value in any command line, a gloo all-reduce across
nodes, the first failure ending the job everywhere with its code, Ctrl-C, and nothing left on any node
(ranks by env marker, everything else by the nodes' process lists against a baseline taken before the job).
Slurm also: auto-detection inside ``salloc`` and ``sbatch`` (no hostfile), and xrun.discover() under plain
``mpirun`` / ``srun``.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.cluster.test_console import SHARED_SCRIPT, assert_shown_once_across_nodes
from tests.conftest import ROOT
from xrun.runner import envpass

from .harness import SUBNET
from .slurm import HYDRA_ARGS, OPENMPI_ARGS, slurm  # noqa: F401 - fixture

MARK = "XRUN_TEST_MARK"
IMPI_BIN = Path(os.environ.get("XRUN_IMPI_BIN", "/opt/xrun-impi/bin"))
ENGINE_ARGS = {
    "openmpi": OPENMPI_ARGS,
    "mpich": HYDRA_ARGS,
    "impi": HYDRA_ARGS,
    "slurm": (),
}
ENGINES = ["openmpi", "mpich", "slurm"]

RANK_SCRIPT = r"""
import json, os, socket, sys, time
keys = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "WEIRD", "XRUN_TOKEN", "PYTHONPATH", "HOME"]
record = {k: os.environ.get(k) for k in keys}
record.update(host=socket.gethostname(), args=sys.argv[1:], cwd=os.getcwd(),
              cpus=sorted(os.sched_getaffinity(0)))
print(json.dumps(record), flush=True)
if os.environ["RANK"] == os.environ.get("FAIL_RANK"):
    time.sleep(0.3)
    sys.exit(int(os.environ.get("FAIL_CODE", "1")))
time.sleep(float(os.environ.get("SLEEP", "0")))
"""

ALLREDUCE_SCRIPT = r"""
import os, socket, sys, torch, torch.distributed as dist
if "--discover" in sys.argv:
    import xrun
    xrun.discover()
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("SUM", dist.get_rank(), os.environ["LOCAL_RANK"], socket.gethostname(), int(t.item()), flush=True)
dist.destroy_process_group()
# torch 2.13's gloo can abort at interpreter teardown after a clean destroy_process_group() (examples/train_ddp.py):
# the work is done and flushed, so leave without those destructors; xrun's handling of a crash is tested elsewhere
if "mpi4py.MPI" in sys.modules:  # --discover under mpirun: MPI is finalized first, or mpirun calls it a crash
    from mpi4py import MPI
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
sys.stderr.flush()
os._exit(0)
"""

WEIRD_ENV = "s3cr3t-77ab sp ace 'sq' \"dq\" $(touch /tmp/xrun-pwned) `id` $HOME \\back\nnew line ünï ✓ #nc"
TORCH_ENV = {"GLOO_SOCKET_IFNAME": "xceth0", "TORCH_CPP_LOG_LEVEL": "ERROR"}  # travel by prefix


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def need_engine(engine):
    programs = {"openmpi": "mpirun.openmpi", "mpich": "mpiexec.hydra", "slurm": "srun",
                "impi": str(IMPI_BIN / "mpiexec.hydra")}
    found = os.path.exists(programs[engine]) if engine == "impi" else subprocess.run(
        ["sh", "-c", f"command -v {programs[engine]}"], capture_output=True).returncode == 0
    if not found:
        reason = f"{engine}: {programs[engine]} not installed"
        if engine != "impi" and os.environ.get("XRUN_REQUIRE_CLUSTER") == "1":
            pytest.fail(reason)
        pytest.skip(reason + (" (pip install --prefix /opt/xrun-impi impi-rt)" if engine == "impi" else ""))


class Job:
    """xrun against the cluster from a scratch directory; the engine's settings come from the fixtures."""

    def __init__(self, cluster, slurm_cluster, tmp_path):
        self.cluster, self.slurm, self.tmp = cluster, slurm_cluster, tmp_path
        (tmp_path / "home").mkdir()
        self.script = tmp_path / "rank.py"
        self.script.write_text(RANK_SCRIPT)
        self.allreduce = tmp_path / "allreduce.py"
        self.allreduce.write_text(ALLREDUCE_SCRIPT)
        # Not in sorted order: node ranks must follow the hostfile, not the engine's own sorting.
        self.hostfile = cluster.hostfile(tmp_path / "hosts", slots=2, nodes=["node3", "node1", "node2"])
        self.mark = uuid.uuid4().hex
        self.baseline = {node.name: set(cluster.pids(node)) for node in cluster.nodes}

    def env(self, extra=None, engine=""):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI"))}
        env.update(HOME=str(self.tmp / "home"), PYTHONPATH=ROOT, **{MARK: self.mark}, **(extra or {}))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update(self.slurm.env)
        if engine == "impi":  # Intel's mpiexec.hydra first on PATH, as setvars.sh would do
            env["PATH"] = f"{IMPI_BIN}:{env['PATH']}"
        return env

    def argv(self, engine, *args, env=None, script=None, script_args=(), hostfile=True):
        exports = [f"--export={name}" for name in (env or {}) if not name.startswith(envpass.PREFIXES)]
        engine_args = ENGINE_ARGS.get(engine, ())
        launcher = ["--launcher", engine] if engine else []
        launcher += [f"--launcher_args={shlex.join(engine_args)}"] if engine_args else []
        hosts = ["-H", str(self.hostfile)] if hostfile else []
        return [sys.executable, "-m", "xrun", *hosts, *launcher, "--export", MARK, *exports, *args,
                str(script or self.script), *script_args]

    def start(self, engine, *args, env=None, script=None, script_args=(), **popen):
        full = self.env(env, engine)
        return subprocess.Popen(self.argv(engine, *args, env=env, script=script, script_args=script_args),
                                cwd=self.tmp, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                **popen)

    def run(self, engine, *args, timeout=90, **kw):
        proc = self.start(engine, *args, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"xrun did not finish in {timeout} s:\n{out}\n{err}") from None
        return proc.returncode, out, err

    def leftovers(self):
        ranks = self.cluster.processes_with_marker(f"{MARK}={self.mark}")
        others = {n.name: sorted(set(self.cluster.pids(n)) - self.baseline[n.name]) for n in self.cluster.nodes}
        return ranks, {k: v for k, v in others.items() if v}

    def assert_clean(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        while True:
            ranks, others = self.leftovers()
            if not ranks and not others:
                return
            if time.monotonic() > deadline:
                described = {pid: _cmdline(pid) for pid in ranks + [p for v in others.values() for p in v]}
                raise AssertionError(f"left behind: ranks {ranks}, node processes {others}: {described}")
            time.sleep(0.05)


@pytest.fixture
def job(cluster, slurm, tmp_path):  # noqa: F811 - slurm is the fixture imported above
    return Job(cluster, slurm, tmp_path)


def records(stdout):
    out = {}
    for line in stdout.splitlines():
        prefix, _, body = line.partition("] ")
        if body.startswith("{"):
            out[prefix + "]"] = json.loads(body)
    return out


NODE_ORDER = ["node3", "node1", "node2"]


@pytest.mark.parametrize("engine", ENGINES + ["impi"])
def test_env_args_and_rank_contract_arrive_exact(job, engine, weird_args):
    need_engine(engine)
    seen = []
    stop = threading.Event()

    def scan():  # while the job runs: no command line here or on any node holds an env value or the token
        while not stop.is_set():
            for pid in os.listdir("/proc"):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"s3cr3t-77ab" in cmdline or b"XRUN_TOKEN=" in cmdline:
                        seen.append(cmdline)
                except OSError:
                    pass
            time.sleep(0.02)

    scanner = threading.Thread(target=scan, daemon=True)
    scanner.start()
    try:
        code, out, err = job.run(engine, "--no_local_rank", env={"WEIRD": WEIRD_ENV, "SLEEP": "0.5"},
                                 script_args=weird_args)
    finally:
        stop.set()
        scanner.join()
    assert code == 0, out + err
    recs = records(out)
    expected = {f"[{NODE_ORDER[r // 2]}:{r}]" for r in range(6)}
    assert set(recs) == expected, out + err
    for key, rec in recs.items():
        rank = int(key.split(":")[1][:-1])
        assert (rec["RANK"], rec["LOCAL_RANK"], rec["GROUP_RANK"]) == (str(rank), str(rank % 2), str(rank // 2))
        assert rec["WORLD_SIZE"] == "6" and rec["LOCAL_WORLD_SIZE"] == "2"
        assert rec["host"] == NODE_ORDER[rank // 2]
        assert rec["MASTER_ADDR"] == "10.77.0.13"  # node 0 is node3
        assert rec["args"] == list(weird_args)
        assert rec["WEIRD"] == WEIRD_ENV
        assert rec["XRUN_TOKEN"] is None  # the agent took it out of the environment before starting ranks
        assert rec["cwd"] == str(job.tmp)
        # the remote account's home as a login gives it, not the head's (job.env sets another): srun starts its
        # tasks without HOME (the never-send list) and the agent restores it from the password database
        assert rec["HOME"] == pwd.getpwuid(os.getuid()).pw_dir, rec
    assert not seen, seen
    assert not os.path.exists("/tmp/xrun-pwned")
    job.assert_clean()


@pytest.mark.torch
@pytest.mark.parametrize("engine", ENGINES)
def test_gloo_allreduce_across_nodes(job, engine):
    need_engine(engine)
    pytest.importorskip("torch")
    code, out, err = job.run(engine, "--num_gpus", "1", "--master_port", "0", env=TORCH_ENV, script=job.allreduce,
                             timeout=150)
    assert code == 0, out + err
    sums = sorted(line.split("] ", 1)[1] for line in out.splitlines() if "] SUM " in line)
    assert sums == [f"SUM {r} 0 {NODE_ORDER[r]} 6" for r in range(3)], out + err
    job.assert_clean()


@pytest.mark.parametrize("engine", ENGINES)
def test_one_failing_rank_ends_the_job_everywhere(job, engine):
    need_engine(engine)
    started = time.monotonic()
    code, out, err = job.run(engine, env={"FAIL_RANK": "3", "FAIL_CODE": "7", "SLEEP": "60"})
    assert code == 7, out + err
    assert time.monotonic() - started < 30
    assert "job failed: rank 3 (local 1) on node1 exited with code 7" in err
    job.assert_clean()


@pytest.mark.parametrize("engine", ENGINES)
def test_ctrl_c_ends_it_everywhere(job, engine):
    need_engine(engine)
    proc = job.start(engine, env={"SLEEP": "60"})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + 45
    while sum(1 for line in lines if '"RANK"' in line) < 6:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines) + proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=45)
    err = proc.stderr.read()
    assert code == 130, err
    assert "stopped by SIGINT" in err
    job.assert_clean()


@pytest.mark.parametrize("engine", ENGINES)
def test_kill_9_of_xrun_leaves_nothing(job, engine):
    # The agents lose the channel and stop their ranks; the engine (srun, mpirun: marked too, it inherits
    # xrun's environment) gets its parent-death signal.
    proc = job.start(engine, env={"SLEEP": "60"})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + 45
    while sum(1 for line in lines if '"RANK"' in line) < 6:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines) + proc.stderr.read()
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    job.assert_clean(timeout=8)


def test_kill_9_before_the_agents_connect_ends_srun(job):
    # srun may still wait for its allocation: without the parent-death signal it would stay queued.
    proc = job.start("slurm", env={"SLEEP": "60"})
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    job.assert_clean(timeout=8)


def test_filters_logs_and_binding_on_an_engine(job, tmp_path):
    need_engine("openmpi")
    logs = tmp_path / "logs"
    code, out, err = job.run("openmpi", "--exclude", "node1:1@node2", "--log_dir", str(logs),
                             "--bind_cores_to_rank", env={"SLEEP": "0"})
    assert code == 0, out + err
    recs = records(out)
    assert set(recs) == {"[node3:0]", "[node3:1]", "[node1:2]"}
    assert recs["[node3:0]"]["cpus"] != recs["[node3:1]"]["cpus"]  # one core each on the 2-core node
    assert recs["[node1:2]"]["LOCAL_WORLD_SIZE"] == "1"
    for host, rank in (("node3", 0), ("node3", 1), ("node1", 2)):
        assert f'"RANK": "{rank}"' in (logs / host / f"rank{rank}" / "stdout.log").read_text()
    job.assert_clean()


# ---------------------------------------------------------------------------------------------------------------
# Inside a Slurm allocation: no hostfile, no --launcher.


@pytest.mark.torch
def test_salloc_auto_detects_the_allocation(job):
    pytest.importorskip("torch")
    argv = job.argv("", "--master_port", "0", env=TORCH_ENV, script=job.allreduce, hostfile=False)
    proc = job.slurm.run(["salloc", "--nodes=3", "--ntasks-per-node=2", "--gpus-per-node=1", *argv],
                         env=job.env(TORCH_ENV), cwd=job.tmp, timeout=150, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "using Slurm allocation" in proc.stderr and "3 node(s), 3 slot(s) from SLURM_GPUS_PER_NODE" in proc.stderr
    sums = sorted(line.split("] ", 1)[1] for line in proc.stdout.splitlines() if "] SUM " in line)
    assert sums == [f"SUM {r} 0 node{r + 1} 6" for r in range(3)], proc.stdout + proc.stderr
    job.assert_clean()


def test_salloc_failure_and_exclude(job):
    argv = job.argv("", "--exclude", "node2", env={"FAIL_RANK": "2", "FAIL_CODE": "5", "SLEEP": "60"},
                    hostfile=False)
    proc = job.slurm.run(["salloc", "--nodes=3", "--ntasks-per-node=2", *argv],
                         env=job.env({"FAIL_RANK": "2", "FAIL_CODE": "5", "SLEEP": "60"}), cwd=job.tmp, timeout=90,
                         check=False)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "job failed: rank 2 (local 0) on node3 exited with code 5" in proc.stderr
    assert {k for k in records(proc.stdout)} == {"[node1:0]", "[node1:1]", "[node3:2]", "[node3:3]"}
    job.assert_clean()


@pytest.mark.torch
def test_sbatch_example_script(job):
    pytest.importorskip("torch")
    output = job.tmp / "slurm-%j.out"
    example = Path(ROOT) / "examples" / "slurm_batch.sh"
    env = job.env(dict(TORCH_ENV, XRUN_PYTHON=sys.executable, XRUN_SCRIPT=str(job.allreduce)))
    # The command line overrides the example's #SBATCH lines (8 GPUs per node; these nodes have 2).
    proc = job.slurm.run(["sbatch", "--wait", "--nodes=3", "--gpus-per-node=1", f"--output={output}",
                          f"--chdir={job.tmp}", str(example)], env=env, timeout=180, check=False)
    logs = "".join(p.read_text() for p in job.tmp.glob("slurm-*.out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    sums = sorted(line.split("] ", 1)[1] for line in logs.splitlines() if "] SUM " in line)
    assert sums == [f"SUM {r} 0 node{r + 1} 6" for r in range(3)], logs
    job.assert_clean()


# ---------------------------------------------------------------------------------------------------------------
# xrun.discover() for scripts that mpirun / srun start directly (no xrun agent).


@pytest.mark.torch
def test_discover_under_plain_mpirun_across_nodes(job):
    need_engine("openmpi")
    pytest.importorskip("torch")
    pytest.importorskip("mpi4py")
    env = job.env(TORCH_ENV)
    argv = ["mpirun.openmpi", *OPENMPI_ARGS, "--host", "node1:2,node2:1", "-np", "3", "--bind-to", "none",
            "-x", "PYTHONPATH", "-x", "GLOO_SOCKET_IFNAME", "-x", "TORCH_CPP_LOG_LEVEL", "-x", MARK,
            sys.executable, str(job.allreduce), "--discover"]
    proc = subprocess.run(argv, env=env, cwd=job.tmp, capture_output=True, text=True, timeout=150,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sums = sorted(line for line in proc.stdout.splitlines() if line.startswith("SUM "))
    assert sums == ["SUM 0 0 node1 6", "SUM 1 1 node1 6", "SUM 2 0 node2 6"], proc.stdout + proc.stderr
    job.assert_clean()


@pytest.mark.torch
def test_discover_under_plain_srun(job):
    pytest.importorskip("torch")
    argv = ["srun", "--nodes=2", "--ntasks=3", "--export=ALL", sys.executable, "-m", "xrun.discovery",
            str(job.allreduce)]
    proc = job.slurm.run(argv, env=job.env(TORCH_ENV), cwd=job.tmp, timeout=150, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sums = sorted(line for line in proc.stdout.splitlines() if line.startswith("SUM "))
    assert sums == ["SUM 0 0 node1 6", "SUM 1 1 node1 6", "SUM 2 0 node2 6"], proc.stdout + proc.stderr
    job.assert_clean()


def test_openmpi_subnet_is_the_cluster_one():
    assert SUBNET == "10.77.0.0/24"  # OPENMPI_ARGS pin oob/btl to it: never any other network


@pytest.mark.parametrize("engine", ENGINES)
def test_a_line_every_rank_prints_is_shown_once_across_nodes(job, engine, python):
    # every node's lines come over the control channel as line records; the head labels and merges them
    need_engine(engine)
    script = job.tmp / "shared.py"
    script.write_text(SHARED_SCRIPT)
    code, out, err = job.run(engine, "--python", python, script=script)  # this tree's agent on the nodes
    assert code == 0, out + err
    assert_shown_once_across_nodes(out, err)
    job.assert_clean()


RESTART_SCRIPT = r"""
import os, sys, time
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
print("attempt", attempt, os.environ["RANK"], os.getppid(), os.environ["TORCHELASTIC_MAX_RESTARTS"], flush=True)
if attempt == "0" and os.environ["RANK"] == "3":
    time.sleep(0.3)
    sys.exit(7)
time.sleep(0.2)
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_crash_restarts_in_place_over_the_engines_agents(job, engine):
    """--max_restarts on an engine (issue 23): the agents the engine started once survive the failure, and the next
    attempt's ranks start under the same agents with the restart count; nothing left behind."""
    need_engine(engine)
    script = job.tmp / "restart.py"
    script.write_text(RESTART_SCRIPT)
    code, out, err = job.run(engine, "--max_restarts", "2", script=script)
    assert code == 0, out + err
    assert "restarting the job on every node: attempt 1 of 3 (after: rank 3 (local 1) on node1 exited with code 7)" \
        in err, err
    seen = {}  # (attempt, rank) -> the agent's pid (the rank's parent)
    for line in out.splitlines():
        prefix, _, body = line.partition("] ")
        if body.startswith("attempt "):
            _, attempt, rank, agent, most = body.split()
            assert most == "2" and prefix == f"[{NODE_ORDER[int(rank) // 2]}:{rank}", line
            seen[(attempt, int(rank))] = agent
    assert {rank for attempt, rank in seen if attempt == "1"} == set(range(6)), out
    assert all(seen[("1", rank)] == agent for (attempt, rank), agent in seen.items() if attempt == "0"), seen
    job.assert_clean()


ENGINE_WORDS = {"mpich": "ssh: connect to host {} port 22: Connection refused",
                "openmpi": "ssh: connect to host {} port 22: Connection refused",
                "impi": "] Error: Unable to run bstrap_proxy on {} (pid "}


@pytest.mark.parametrize("spelling", ["node2", "NODE2", "10.77.12"])
@pytest.mark.parametrize("engine", ["mpich", "impi", "openmpi"])
def test_a_host_whose_sshd_refuses_ends_the_start_at_once_in_the_engines_words(job, engine, spelling):
    # issue 33 §3: xrun -H hosts --launcher mpich, ssh to a host refused: hydra printed "ssh: connect to host ...
    # Connection refused" and xrun waited the whole --join_timeout when ssh spelled the host otherwise than the
    # hostfile (lowercased, or the address it resolved); pdsh and ssh end the wait at once, and so must every engine
    need_engine(engine)
    assert SUBNET.startswith("10.77.0.")  # "10.77.12" is node2's address, 10.77.0.12, as inet_aton reads it
    os.kill(job.cluster.sshd_pid("node2"), signal.SIGKILL)  # the node is up; only its sshd is gone
    job.hostfile.write_text(f"node1 slots=1\n{spelling} slots=1\nnode3 slots=1\n")
    started = time.monotonic()
    code, out, err = job.run(engine, "--join_timeout", "120", timeout=150)
    elapsed = time.monotonic() - started
    assert code == 255 and elapsed < 30, (elapsed, err)  # ssh's code, at once: not the --join_timeout's 1
    assert records(out) == {}, out  # no rank started
    # ssh names the host as it connected to it (lowercased, the address); Intel MPI's hydra keeps ssh's words to
    # itself and names the host as the hostfile does
    said = spelling if engine == "impi" else ("10.77.0.12" if spelling == "10.77.12" else "node2")
    words = ENGINE_WORDS[engine].format(said)
    last = err.splitlines()[-1]
    assert last.startswith(f"xrun: job failed: the session to {spelling} exited with code 255 before its agent "
                           f"connected ("), err
    assert words in last, err
    job.assert_clean()
