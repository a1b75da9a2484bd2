"""Slurm 22.05 and the MPI engines on top of the network-namespace cluster (harness.py).

``SlurmCluster(cluster).up()`` starts, all under ``<cluster work dir>/slurm`` (so the harness's teardown kills
and removes them with everything else):

* ``munged`` in the root namespace with a fresh key and its own socket (``AuthInfo=socket=...``), so a system
  munged, if any, is never touched;
* ``slurmctld`` in the root namespace (``SlurmctldHost=<this machine>(10.77.0.1)``, the bridge address);
* one ``slurmd -N nodeI`` per node namespace (each namespace has its own port 6818), with per-node spool, pid,
  log and ``TmpFS`` directories (``%n``), created first because slurmd does not create them.

Clients find it through ``SLURM_CONF`` (``slurm.env``; never run a Slurm client without it: srun then looks
the controller up with a DNS SRV query).  Each node has ``CPUs=2`` and two stand-in GPUs (``Gres=gpu:2``, device
files that are /dev/null), so ``--gpus-per-node`` works and allocation discovery is tested against real
``SLURM_*`` variables.  See /work/shared/notes/test-cluster.md for the why of each
line of the config.

MPI: ``OPENMPI_ARGS`` and ``HYDRA_ARGS`` are the engine arguments that make ``mpirun``/``mpiexec.hydra`` work
from the root namespace (interfaces pinned to the cluster subnet, root allowed).

Fixture: ``slurm`` (function scope, on top of the session ``cluster``) brings Slurm up once and checks it is
healthy before every test (a test that took the shared cluster down, or killed a node, gets it back).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from .harness import BRIDGE, BRIDGE_ADDRESS, SUBNET, Cluster, ClusterError, _proc_stat, _running, tool

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "salloc", "sinfo", "scontrol")
GPUS_PER_NODE = 2
CPUS_PER_NODE = 2
READY_TIMEOUT = 20.0

# OpenMPI from the root namespace: root must be allowed, and both the runtime (oob) and the byte transfer
# layer (btl) must stay on the cluster's subnet (the default would also try eth0 and loopback).
OPENMPI_ARGS = (
    "--allow-run-as-root",
    "--mca", "oob_tcp_if_include", SUBNET,
    "--mca", "btl_tcp_if_include", SUBNET,
)
# MPICH's hydra: this machine's own hostname resolves to 127.0.0.1, so name the bridge for the proxies'
# connections back to mpiexec.
HYDRA_ARGS = ("-iface", BRIDGE)


def missing_slurm_tools() -> list[str]:
    return [name for name in SLURM_TOOLS if _which(name) is None]


def _which(name: str) -> str | None:
    try:
        return tool(name)
    except ClusterError:
        return None


class SlurmCluster:
    """munged + slurmctld (root namespace) and one slurmd per node of ``cluster``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.dir: Path | None = None
        self._ctld: tuple[int, int] | None = None
        self._munged: tuple[int, int] | None = None
        self._slurmd: dict[str, tuple[int, int]] = {}

    # -- paths -----------------------------------------------------------------------------------------------

    @property
    def _d(self) -> Path:
        if self.dir is None:
            raise ClusterError("slurm is not up")
        return self.dir

    @property
    def conf(self) -> Path:
        return self._d / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self._d / "munge" / "munge.sock"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs in its environment (on top of os.environ)."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(self.env)
        env.update(extra or {})
        return env

    # -- lifecycle -------------------------------------------------------------------------------------------

    def up(self) -> SlurmCluster:
        self.cluster.up()
        self.dir = Path(self.cluster.workdir) / "slurm"  # type: ignore[arg-type]
        self.dir.mkdir()
        for sub in ("munge", "ctld", "spool", "tmp", "dev"):
            (self.dir / sub).mkdir(mode=0o700 if sub == "munge" else 0o755)
        for index in range(GPUS_PER_NODE):  # stand-ins for /dev/nvidiaN: char devices with /dev/null's numbers
            os.mknod(self.dir / "dev" / f"gpu{index}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        for node in self.cluster.nodes:
            (self.dir / "spool" / node.name).mkdir()
            (self.dir / "tmp" / node.name).mkdir()
        self._write_config()
        self._start_munged()
        self._start_slurmctld()
        self._start_slurmds([node.name for node in self.cluster.nodes])
        self.wait_idle()
        return self

    def down(self) -> None:
        """Stop the daemons (the cluster's teardown would kill them anyway; this keeps the cluster up)."""
        pids = [p for p in (self._ctld, self._munged, *self._slurmd.values()) if p is not None]
        for pid, start in pids:
            if _running(pid, start):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        self._ctld = self._munged = None
        self._slurmd.clear()
        self.dir = None

    @property
    def healthy(self) -> bool:
        if self.dir is None or not self.cluster.is_up or not str(self.dir).startswith(str(self.cluster.workdir)):
            return False
        daemons = [self._ctld, self._munged, *self._slurmd.values()]
        return len(self._slurmd) == self.cluster.n and all(d is not None and _running(*d) for d in daemons)

    def ensure_healthy(self) -> None:
        """Slurm up on the current cluster, every node idle (restart what a test killed)."""
        if not self.healthy:
            self.down()
            self.up()
            return
        self.wait_idle()

    # -- daemons ---------------------------------------------------------------------------------------------

    def _write_config(self) -> None:
        d = self._d
        n = self.cluster.n
        nodes = f"node[1-{n}]" if n > 1 else "node1"
        (d / "slurm.conf").write_text(
            f"""# written by tests/cluster/slurm.py
ClusterName=xrun
SlurmctldHost={socket.gethostname()}({BRIDGE_ADDRESS})
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={d / "ctld"}
SlurmdSpoolDir={d / "spool"}/%n
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdLogFile={d}/slurmd-%n.log
# all nodes share /tmp; srun --mpi=pmix needs a per-node one
TmpFS={d / "tmp"}/%n
# no cgroups inside the namespaces (see cgroup.conf)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
ReturnToService=2
# seconds between SIGTERM and SIGKILL when a step is cancelled (default 30)
KillWait=5
InactiveLimit=0
MessageTimeout=10
GresTypes=gpu
NodeName={nodes} CPUs={CPUS_PER_NODE} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        # slurmd 22.05 always loads a cgroup plugin and autodetection fails inside a netns; v1 loads, unused.
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        # GPU GRES without GPUs: slurmd wants a device file per GPU (a count alone registers 0 GPUs and drains
        # the node); char devices with /dev/null's numbers do. Slurm then allocates and reports them as GPUs.
        (d / "gres.conf").write_text(f"NodeName={nodes} Name=gpu File={d / 'dev'}/gpu[0-{GPUS_PER_NODE - 1}]\n")

    def _start_munged(self) -> None:
        munge = self._d / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        _run_daemon([
            tool("munged"), "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--log-file={munge / 'munged.log'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}",
        ])
        self._munged = _wait_pidfile(munge / "munged.pid", munge / "munged.log", "munged")

    def _start_slurmctld(self) -> None:
        d = self._d
        _run_daemon([tool("slurmctld"), "-f", str(self.conf), "-i"], env=self.client_env())
        self._ctld = _wait_pidfile(d / "slurmctld.pid", d / "slurmctld.log", "slurmctld")

    def _start_slurmds(self, names: Sequence[str]) -> None:
        d = self._d
        procs = [
            subprocess.Popen(
                self.cluster.node_argv(name, [tool("slurmd"), "-f", str(self.conf), "-N", name]),
                env=self.client_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True,
            )
            for name in names
        ]
        for name, proc in zip(names, procs):
            out, _ = proc.communicate(timeout=30)
            if proc.returncode != 0:
                raise ClusterError(f"slurmd on {name} exited {proc.returncode}: {out.strip()}")
            pid = _wait_pidfile(d / f"slurmd-{name}.pid", d / f"slurmd-{name}.log", f"slurmd on {name}")
            self._slurmd[name] = pid
            self.cluster.keep_daemon(pid[0])

    def wait_idle(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every node is idle (registered, no job still completing)."""
        deadline = time.monotonic() + timeout
        states = ""
        while True:
            proc = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = proc.stdout.strip()
            lines = [line.split() for line in states.splitlines()]
            if len(lines) == self.cluster.n and all(state == "idle" for _, state in lines):
                return
            if time.monotonic() > deadline:
                log = (self._d / "slurmctld.log").read_text(errors="replace")[-2000:]
                raise ClusterError(f"slurm nodes not idle after {timeout:g} s: {states!r}; slurmctld log: {log}")
            time.sleep(0.1)

    # -- helpers for tests -----------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, env: dict[str, str] | None = None, check: bool = True,
            **kwargs: Any) -> subprocess.CompletedProcess:
        """A Slurm client command in the root namespace (the 'login node')."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        proc = subprocess.run(list(argv), env=self.client_env(env), **kwargs)
        if check and proc.returncode != 0:
            raise ClusterError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def log(self, name: str = "slurmctld") -> str:
        path = self._d / ("slurmctld.log" if name == "slurmctld" else f"slurmd-{name}.log")
        return path.read_text(errors="replace")


def _run_daemon(argv: Sequence[str], env: dict[str, str] | None = None) -> None:
    """Start a daemon that forks into the background; its foreground part must exit 0."""
    proc = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")


def _wait_pidfile(pidfile: Path, log: Path, what: str, timeout: float = 10.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            stat = _proc_stat(pid)
            if stat is not None and stat[0] != "Z":
                return pid, stat[1]
        if time.monotonic() > deadline:
            text = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise ClusterError(f"{what} did not start within {timeout:g} s; its log: {text}")
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------------------------
# Fixtures: import them into a test module (`from tests.cluster.slurm import slurm`, with noqa F401 on that line)

_shared: dict[int, SlurmCluster] = {}


@pytest.fixture
def slurm(cluster: Cluster) -> Iterator[SlurmCluster]:
    missing = missing_slurm_tools()
    if missing:
        reason = f"slurm tools missing: {', '.join(missing)} (install with .ci/cluster-deps.sh)"
        if os.environ.get("XRUN_REQUIRE_CLUSTER") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    found = _shared.get(id(cluster))
    if found is None:
        found = _shared[id(cluster)] = SlurmCluster(cluster)
    found.ensure_healthy()
    yield found
