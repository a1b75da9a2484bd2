"""A real multi-host test cluster on one machine, built from Linux network namespaces.

Every node ``nodeI`` is a network namespace (``xrc-nodeI``) with a veth to a bridge in the root namespace, the
same interface name inside every node (``xceth0``, so one ``GLOO_SOCKET_IFNAME``/``btl_tcp_if_include`` fits
all), address ``10.77.0.(10+I)/24``, no default route, a persistent UTS namespace so ``hostname`` prints
``nodeI``, an ``/etc/hosts`` line, and its own sshd.  The client side gets a generated key, a known_hosts with
the cluster's host key (host-key checking stays ON) and an ssh_config, both as files in the work dir and as a
drop-in in ``/etc/ssh/ssh_config.d/`` so plain ssh, pdsh, mpirun, hydra and srun use it without flags.
See ``/work/shared/notes/test-cluster.md`` for the measurements behind the choices.

Use from a test (``tests/cluster/conftest.py`` has the fixtures)::

    def test_something(cluster):                      # 3 nodes, shared by the session
        r = cluster.ssh("node2", [cluster.python, "-c", "import socket; print(socket.gethostname())"])
        assert r.stdout.strip() == "node2"

    def test_bigger(make_cluster):                    # a cluster of its own, torn down after the test
        c = make_cluster(8)

and by hand::

    python -m tests.cluster.harness up 4 --state /tmp/xrun-cluster.json
    ssh node1 hostname                                # or: ssh -F <work dir>/ssh_config node1 hostname
    python -m tests.cluster.harness down --state /tmp/xrun-cluster.json

Things to know:

* The remote PATH is the system one.  sshd sets ``SHLVL=1`` for sessions (``SetEnv``), which makes Debian's
  bash skip root's ``~/.bashrc`` (``pyenv init`` there costs ~0.35 s CPU per ssh command), so pyenv's shims
  are not on the remote PATH: run interpreters by absolute path (``cluster.python`` is ``sys.executable``).
* Namespaces share the filesystem and the PID space: a process "on node2" is visible on the host.  Tag
  processes with an environment marker and use ``processes_with_marker``, or ``pids(node)`` per node.
* One cluster per machine at a time (node names, addresses and the drop-in are global).  A second ``up``
  waits for the first cluster's owner (``busy_timeout``) and then cleans whatever a crashed owner left.
* ``with cluster.cpu_limited("node3", 0.1):`` throttles a node: every process on it, and whatever its sshd starts
  meanwhile, shares 10% of one core (a cgroup's CFS bandwidth limit, v2's ``cpu.max`` or v1's cfs quota); the
  cgroup goes on leaving, and a killed owner's with the next ``up``.
* Only loopback and the namespaces' own addresses are ever targeted.  The safety route
  ``unreachable 10.77.0.0/16 metric 4000`` is added before anything else and deliberately left in place on
  teardown: it is inert, and it guarantees that traffic to the range can never leave through eth0.

This module is stdlib-only, so it also runs as a script (``python tests/cluster/harness.py up 4``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Union

TAG = "xrun-cluster"  # on every hosts line, in the drop-in, in the work dir's name
SUBNET = "10.77.0.0/24"
PREFIX_LEN = 24
BRIDGE = "xrcbr0"
BRIDGE_ADDRESS = "10.77.0.1"
IFACE = "xceth0"  # the in-namespace end of every node's veth
NETNS_PREFIX = "xrc-"  # netns xrc-node1, ...
VETH_PREFIX = "xrcv"  # host-side veth xrcv1, ...
ADDRESS_OFFSET = 10  # node I is 10.77.0.(10+I)
MAX_NODES = 200
SAFETY_ROUTE = ("unreachable", "10.77.0.0/16", "metric", "4000")
SSH_PORT = 22

RUN_ROOT = Path("/run")
WORKDIR_PREFIX = TAG + "-"  # /run/xrun-cluster-XXXXXXXX
DROP_IN = Path("/etc/ssh/ssh_config.d/xrun-cluster.conf")
HOSTS = Path("/etc/hosts")
LOCK_PATH = Path("/run/lock/xrun-cluster.lock")
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it; not configurable

HARNESS_TOOLS = ("ip", "sshd", "ssh", "ssh-keygen", "unshare", "nsenter", "hostname")
_SBIN_PATH = os.pathsep.join((os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"))

NodeRef = Union["Node", str, int]


class ClusterError(RuntimeError):
    """Bring-up, teardown or a helper failed; the message says which step and why."""


class ClusterBusy(ClusterError):
    """Another live cluster holds the machine (node names, addresses and the drop-in are global)."""


@dataclass(frozen=True)
class Node:
    index: int  # 1-based
    name: str  # nodeI: hostname inside, /etc/hosts name, ssh host
    address: str  # 10.77.0.(10+I)
    netns: str  # xrc-nodeI
    host_veth: str  # xrcvI, the root-namespace end (cut/heal act on it)
    uts: str  # bind-mounted UTS namespace file that makes `hostname` print nodeI

    @classmethod
    def make(cls, index: int, workdir: Path) -> Node:
        return cls(
            index=index,
            name=f"node{index}",
            address=f"10.77.0.{ADDRESS_OFFSET + index}",
            netns=f"{NETNS_PREFIX}node{index}",
            host_veth=f"{VETH_PREFIX}{index}",
            uts=str(workdir / "uts" / f"node{index}"),
        )


# ---------------------------------------------------------------------------------------------------------------
# Requirements


def tool(name: str) -> str:
    """Absolute path of a tool (sbin included), or raise ClusterError."""
    found = shutil.which(name, path=_SBIN_PATH)
    if found is None:
        raise ClusterError(f"{name} not found (install the cluster packages: .ci/cluster-deps.sh)")
    return found


def missing_requirements(extra_tools: Iterable[str] = ()) -> list[str]:
    """Why a cluster cannot be built here; empty when it can."""
    problems = []
    if sys.platform != "linux":
        problems.append(f"needs Linux network namespaces (this is {sys.platform})")
    elif os.geteuid() != 0:
        problems.append(f"needs root for network namespaces and sshd (euid is {os.geteuid()})")
    missing = [t for t in (*HARNESS_TOOLS, *extra_tools) if shutil.which(t, path=_SBIN_PATH) is None]
    if missing:
        problems.append(f"missing tools: {', '.join(missing)} (install with .ci/cluster-deps.sh)")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# Processes (the namespaces share the PID space: everything here reads /proc of the host)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, starttime) of a process, None if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # comm may contain spaces and parentheses
    return fields[0].decode(), int(fields[19])  # proc(5): field 3 is state, field 22 starttime


def _running(pid: int, starttime: int | None = None) -> bool:
    """Alive and not a zombie (PID 1 here reaps orphans only every ~2 s), and the same process if starttime."""
    stat = _proc_stat(pid)
    return stat is not None and stat[0] != "Z" and (starttime is None or stat[1] == starttime)


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def netns_pids(netns: str, *, include_zombies: bool = False) -> list[int]:
    """Processes in a named network namespace: what `ip netns pids` prints, without the exec."""
    try:
        ref = os.stat(f"/run/netns/{netns}")
    except OSError:
        return []
    pids = []
    for pid in _all_pids():
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (ref.st_dev, ref.st_ino) and (include_zombies or _running(pid)):
            pids.append(pid)
    return pids


def processes_with_marker(marker: str) -> list[int]:
    """Running processes whose environment holds `marker`.

    ``"NAME=VALUE"`` matches that exact entry; a bare ``"NAME"`` matches the variable with any value.
    Zombies count as gone.  The calling process itself is never reported.
    """
    needle = marker.encode()
    by_name = b"=" not in needle
    found = []
    for pid in _all_pids():
        if pid == os.getpid():
            continue
        try:
            entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        hit = any(e.startswith(needle + b"=") for e in entries) if by_name else needle in entries
        if hit and _running(pid):
            found.append(pid)
    return found


def _kill_until_gone(find: Callable[[], list[int]], *, keep: Iterable[int] = (), timeout: float = 5.0) -> None:
    """SIGKILL what `find` returns (minus `keep`) until nothing is left running; new forks are caught too."""
    keep = set(keep)
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in find() if p not in keep]
        if not pids:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"processes survive SIGKILL after {timeout} s: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------------------------
# Commands


def _check(argv: Sequence[str], proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        raise ClusterError(f"`{shlex.join(argv)}` exited {proc.returncode}: {(proc.stderr or '').strip()}")
    return proc


def _run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True, timeout: float = 30):
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    return _check(argv, proc) if check else proc


def _run_parallel(
    commands: Sequence[Sequence[str]], *, stdins: Sequence[str] | None = None, timeout: float = 30
) -> None:
    """Run commands concurrently; raise for the first that failed (bring-up is N small execs)."""
    procs: list[subprocess.Popen] = []
    try:
        for argv in commands:
            procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE if stdins is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline = time.monotonic() + timeout
        failures = []
        for i, (argv, proc) in enumerate(zip(commands, procs)):
            out, err = proc.communicate(
                stdins[i] if stdins is not None else None, timeout=max(0.1, deadline - time.monotonic())
            )
            if proc.returncode != 0:
                failures.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
        if failures:
            first = failures[0]
            raise ClusterError(
                f"{len(failures)} of {len(commands)} commands failed; first: `{shlex.join(first.args)}` exited "
                f"{first.returncode}: {first.stderr.strip()}"
            )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------------------------------------------------------
# Mounts (the persistent UTS namespaces are nsfs bind mounts under the work dir)

_MS_BIND = 4096
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_libc: Any = None


def _libc_call(name: str, *args: Any) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
        _libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}", args[1] if name == "mount" else args[0])


def _bind_private(directory: Path) -> None:
    """Make `directory` a private mount, as `ip netns` does for /run/netns: `unshare --uts=FILE` refuses to
    bind a namespace under a shared mount (systemd makes / shared), so the files must live below one."""
    path = str(directory).encode()
    _libc_call("mount", path, path, None, _MS_BIND, None)
    _libc_call("mount", None, path, None, _MS_PRIVATE, None)


def _mounts_under(prefix: str) -> list[str]:
    """Mount points whose path starts with `prefix`, deepest first."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def _umount(point: str) -> None:
    try:
        _libc_call("umount2", point.encode(), _MNT_DETACH)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOENT):  # not mounted (any more)
            raise


# ---------------------------------------------------------------------------------------------------------------
# CPU limits (a throttled node): the kernel's CFS bandwidth control, cgroup v2's cpu.max or v1's cfs quota

CPU_PERIOD_US = 100_000  # the kernel's default CFS period


@dataclass(frozen=True)
class CpuController:
    """Where the cpu controller is mounted and which interface it speaks: 2 (``cpu.max``) or 1
    (``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``: the same bandwidth control)."""

    root: Path
    version: int

    def limit(self, group: Path, share: float) -> None:
        """Let the processes in `group` run ``share`` of one core per CFS period, all together."""
        quota = max(1000, round(share * CPU_PERIOD_US))  # the kernel's least quota is 1 ms
        if self.version == 2:
            (group / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))

    def group_of(self, pid: int) -> Path | None:
        """The cgroup `pid` is in under this controller; None once it is gone."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:  # "hierarchy-ID:controller-list:path", cgroup(7)
            _, controllers, path = line.split(":", 2)
            if (controllers == "" if self.version == 2 else "cpu" in controllers.split(",")):
                return self.root / path.lstrip("/")
        return None


def cpu_controller() -> CpuController | None:
    """The cpu controller where a cgroup of ours can limit CPU bandwidth, None where there is none."""
    with open("/proc/self/mounts", encoding="utf-8") as f:
        mounts = [line.split()[1:4] for line in f]
    for point, kind, options in mounts:
        root = Path(point.replace("\\040", " "))
        if kind == "cgroup" and "cpu" in options.split(",") and (root / "cpu.cfs_quota_us").exists():
            return CpuController(root, 1)
        if kind == "cgroup2":
            with contextlib.suppress(OSError):
                if "cpu" in (root / "cgroup.subtree_control").read_text().split():  # a child of the root gets cpu.max
                    return CpuController(root, 2)
    return None


def _move(pid: int, group: Path) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        (group / "cgroup.procs").write_text(str(pid))  # one write per pid: the file takes one at a time


def _tagged_cgroups() -> list[Path]:
    controller = cpu_controller()
    if controller is None:
        return []
    return sorted(controller.root.glob(WORKDIR_PREFIX + "*"))


def _remove_cgroup(group: Path, home: Path, timeout: float = 5.0) -> None:
    """Move what runs in `group` to `home` and remove `group` (a process forking meanwhile is caught too)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            for pid in (group / "cgroup.procs").read_text().split():
                _move(int(pid), home)
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise ClusterError(f"cannot remove the cgroup {group}: {e}") from e
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------------------------
# Machine-wide state: lock, owners, leftovers


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Serialise claim-and-clean between processes; held for a moment, never for a cluster's lifetime."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _workdirs() -> list[Path]:
    return sorted(p for p in RUN_ROOT.glob(WORKDIR_PREFIX + "*") if p.is_dir())


def _read_owner(workdir: Path) -> dict[str, Any]:
    try:
        return json.loads((workdir / "owner.json").read_text())
    except (OSError, ValueError):
        return {}


def _owner_alive(owner: dict[str, Any]) -> bool:
    return any(_running(pid, start) for pid, start in owner.get("pids", []))


def _describe_owner(workdir: Path, owner: dict[str, Any]) -> str:
    pids = ",".join(str(p) for p, _ in owner.get("pids", []))
    if owner.get("kind") == "detached":
        state = owner.get("state") or "?"
        return f"cluster {workdir} started by `harness up` (state {state}); stop it with `harness down --state {state}`"
    return f"cluster {workdir} owned by pid {pids} ({owner.get('cmdline', '?')})"


def _live_owners() -> list[tuple[Path, dict[str, Any]]]:
    return [(w, o) for w in _workdirs() if _owner_alive(o := _read_owner(w))]


def live_clusters() -> list[str]:
    """Descriptions of clusters whose owner is alive."""
    return [_describe_owner(w, o) for w, o in _live_owners()]


def _tagged_netns() -> list[str]:
    try:
        return sorted(n for n in os.listdir("/run/netns") if n.startswith(NETNS_PREFIX))
    except FileNotFoundError:
        return []


def _tagged_links() -> list[str]:
    return sorted(n for n in os.listdir("/sys/class/net") if n.startswith(VETH_PREFIX) or n == BRIDGE)


def _ancestors() -> set[int]:
    """This process and its parents: `harness down --state /run/xrun-cluster-.../x.json` must not kill itself."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def _tagged_processes() -> list[int]:
    """Running processes started from a work dir (sshd keeps its argv in its title) or inside a node."""
    needle = str(RUN_ROOT / WORKDIR_PREFIX).encode()
    pids = []
    mine = _ancestors()
    for pid in _all_pids():
        if pid in mine:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and _running(pid):
            pids.append(pid)
    for netns in _tagged_netns():
        pids.extend(netns_pids(netns))
    return sorted(set(pids) - mine)


def _hosts_lines(selector: str) -> list[str]:
    try:
        return [line for line in HOSTS.read_text().splitlines() if selector in line]
    except FileNotFoundError:
        return []


def leftovers(cluster_id: str | None = None) -> list[str]:
    """Everything carrying the tag that is still on the machine; empty after a clean teardown.

    With `cluster_id`, only what belonged to that cluster: its work dir, mounts, hosts lines, drop-in and
    processes, and the machine-wide names (netns, links) only while no other cluster has a work dir, since
    another cluster brought up meanwhile (by a waiting `up` elsewhere) legitimately uses the same names.
    """
    workdir = None if cluster_id is None else str(RUN_ROOT / (WORKDIR_PREFIX + cluster_id))
    global_names = cluster_id is None or all(str(w) == workdir for w in _workdirs())
    found = [f"netns {n}" for n in _tagged_netns()] if global_names else []
    found += [f"link {n}" for n in _tagged_links()] if global_names else []
    found += [f"work dir {w}" for w in _workdirs() if workdir in (None, str(w))]
    found += [f"mount {m}" for m in _mounts_under(f"{workdir}/" if workdir else str(RUN_ROOT / WORKDIR_PREFIX))]
    found += [f"{HOSTS} line {line!r}" for line in _hosts_lines(f"# {TAG} {cluster_id or ''}")]
    found += [f"cgroup {g}" for g in _tagged_cgroups() if workdir is None or g.name.startswith(Path(workdir).name + "-")]
    with contextlib.suppress(FileNotFoundError):
        if f"# {TAG} {cluster_id or ''}" in DROP_IN.read_text():
            found.append(f"ssh drop-in {DROP_IN}")
    if global_names:
        pids = _tagged_processes()
    else:  # only processes started from this cluster's work dir can be told apart
        pids = [p for p in _all_pids() if workdir in _cmdline(p) and _running(p)]
    found += [f"process {pid}: {_cmdline(pid)}" for pid in pids]
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _rewrite_hosts(keep: Callable[[str], bool], add: Sequence[str] = ()) -> None:
    """Rewrite /etc/hosts in place (it may be a bind mount, so never replace the file)."""
    with open(HOSTS, "r+", encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
        new = [line for line in lines if keep(line)]
        if new and not new[-1].endswith("\n"):
            new[-1] += "\n"
        new += add
        if new != lines:
            f.seek(0)
            f.write("".join(new))
            f.truncate()


def purge() -> None:
    """Remove everything that carries the tag: processes in or started from a cluster, host veths, the bridge,
    namespaces, UTS mounts, /etc/hosts lines, the drop-in and the work dirs (the owner file goes last, so a
    waiting `up` sees the cluster as busy until the machine is clean).  Only call it when no live cluster
    should survive: `Cluster.up` does so under the machine lock after checking owners."""
    _kill_until_gone(_tagged_processes)
    for group in _tagged_cgroups():  # a throttled node's, left by an owner killed inside `cpu_limited`
        _remove_cgroup(group, group.parent)
    ip = tool("ip")
    batch = [f"link del {link}" for link in _tagged_links() if link != BRIDGE]  # synchronous, unlike netns del
    batch += [f"netns del {netns}" for netns in _tagged_netns()]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        batch.append(f"link del {BRIDGE}")
    if batch:
        _run([ip, "-force", "-batch", "-"], stdin="\n".join(batch) + "\n", check=False)
    for point in _mounts_under(str(RUN_ROOT / WORKDIR_PREFIX)):
        _umount(point)
    _rewrite_hosts(lambda line: f"# {TAG} " not in line)
    with contextlib.suppress(FileNotFoundError):
        if TAG in DROP_IN.read_text():
            DROP_IN.unlink()
    for workdir in _workdirs():
        if (workdir / "created-privsep-dir").exists():
            with contextlib.suppress(OSError):
                PRIVSEP_DIR.rmdir()  # only if still empty: a real sshd may have moved in
        shutil.rmtree(workdir, ignore_errors=True)
    remaining = leftovers()
    if remaining:
        raise ClusterError("teardown left: " + "; ".join(remaining))


# ---------------------------------------------------------------------------------------------------------------
# The cluster

_IN_PROCESS: list[Cluster] = []  # clusters up and owned by this process (atexit tears them down)
stats = {"claim_s": 0.0}  # this process's total time spent claiming the machine (the pytest summary shows it)


class Cluster:
    """N nodes ``node1..nodeN``, each its own network namespace, UTS namespace and sshd.

    Context manager: ``with Cluster(4) as c: ...`` brings it up and tears it down (also when bring-up fails
    halfway).  Attributes once up: ``nodes`` (tuple of `Node`), ``workdir``, ``ssh_config``, ``known_hosts``,
    ``identity`` (client private key), ``drop_in``, ``bridge``, ``bridge_address``, ``iface``, ``subnet``,
    ``python`` (absolute interpreter path to use in remote commands), ``timings`` (seconds: ``claim`` waiting
    for the machine, ``up`` the bring-up proper, ``down``).

    ``busy_timeout``: how long `up` waits for another live cluster on the machine before raising
    `ClusterBusy`.  ``detach``: the cluster outlives this process (the CLI's ``up``); it counts as live while
    any of its sshds runs.
    """

    def __init__(self, n: int = 3, *, busy_timeout: float = 600.0, detach: bool = False, state: str | None = None):
        if not 1 <= n <= MAX_NODES:
            raise ValueError(f"a cluster has 1..{MAX_NODES} nodes, not {n}")
        self.n = n
        self.busy_timeout = busy_timeout
        self.detach = detach
        self.state = state  # the CLI's state file, recorded in the owner file for error messages
        self.bridge = BRIDGE
        self.bridge_address = BRIDGE_ADDRESS
        self.iface = IFACE
        self.subnet = SUBNET
        self.drop_in = DROP_IN
        self.python = sys.executable
        self.timings: dict[str, float] = {}
        self.workdir: Path | None = None
        self.nodes: tuple[Node, ...] = ()
        self._sshd: dict[str, tuple[int, int]] = {}  # node name -> (pid, starttime) of its listening sshd
        self._daemons: dict[int, int] = {}  # pid -> starttime of other node daemons to keep (keep_daemon)
        self._cut: set[str] = set()
        self._owner_pid = os.getpid()

    # -- paths -----------------------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._wd.name[len(WORKDIR_PREFIX) :]

    @property
    def ssh_config(self) -> Path:
        """Client config for ``ssh -F`` / paramiko's SSHConfig (the drop-in holds the same block)."""
        return self._wd / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self._wd / "ssh" / "known_hosts"

    @property
    def identity(self) -> Path:
        return self._wd / "ssh" / "id_ed25519"

    @property
    def is_up(self) -> bool:
        return self.workdir is not None

    @property
    def _wd(self) -> Path:
        if self.workdir is None:
            raise ClusterError("the cluster is not up")
        return self.workdir

    def __repr__(self) -> str:
        where = f" at {self.workdir}" if self.workdir else " (down)"
        return f"<Cluster {self.n} nodes{where}>"

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Cluster:
        if self.is_up:
            return self
        problems = missing_requirements()
        if problems:
            raise ClusterError("cannot build the cluster: " + "; ".join(problems))
        claim = time.monotonic()
        self._claim()
        start = time.monotonic()
        self.timings["claim"] = start - claim  # waiting for another cluster, cleaning a crashed one
        stats["claim_s"] += start - claim
        try:
            self._bring_up()
        except BaseException:
            with contextlib.suppress(Exception):  # the bring-up error is the one to report
                self._teardown()
            raise
        if self.detach:
            self._write_owner()
        else:
            _IN_PROCESS.append(self)
        self.timings["up"] = time.monotonic() - start
        return self

    def down(self) -> None:
        """Tear everything down: processes on the nodes, sshds, links, namespaces, mounts, hosts lines, the
        drop-in and the work dir.  Idempotent; raises ClusterError if anything is left behind."""
        if not self.is_up:
            return
        start = time.monotonic()
        try:
            self._teardown()
        finally:
            with contextlib.suppress(ValueError):
                _IN_PROCESS.remove(self)
        self.timings["down"] = time.monotonic() - start

    def _claim(self) -> None:
        """Wait until no live cluster holds the machine, clean what dead ones left, and claim it."""
        deadline = time.monotonic() + self.busy_timeout
        told = False
        while True:
            with _machine_lock():
                owners = _live_owners()
                if not owners:
                    purge()
                    self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX, dir=RUN_ROOT))
                    self.nodes = tuple(Node.make(i, self.workdir) for i in range(1, self.n + 1))
                    self._write_owner()
                    return
            busy = "; ".join(_describe_owner(w, o) for w, o in owners)
            if any(pid == os.getpid() for _, o in owners for pid, _ in o.get("pids", [])):
                raise ClusterBusy(f"this process already has a cluster up: {busy} (down() it first)")
            if time.monotonic() >= deadline:
                raise ClusterBusy(f"the machine holds a live cluster: {busy}")
            if not told:
                print(f"xrun-cluster: waiting up to {self.busy_timeout:.0f} s for {busy}", file=sys.stderr)
                told = True
            time.sleep(0.25)

    def _write_owner(self) -> None:
        if self.detach and self._sshd:
            pids = list(self._sshd.values())  # live while any of its sshds runs
        else:
            stat = _proc_stat(os.getpid())
            pids = [(os.getpid(), stat[1] if stat else 0)]
        owner = {
            "kind": "detached" if self.detach else "process",
            "pids": pids,
            "state": self.state,
            "cmdline": shlex.join(sys.argv),
        }
        tmp = self._wd / "owner.json.tmp"
        tmp.write_text(json.dumps(owner))
        tmp.replace(self._wd / "owner.json")

    def _teardown(self) -> None:
        owner = _read_owner(self._wd)
        try:
            if owner and not any(pid == os.getpid() for pid, _ in owner.get("pids", [])) and not self.detach:
                raise ClusterError(f"{self._wd} is not owned by this process any more; not touching it")
            # Under the lock: a waiting `up` elsewhere claims the machine the moment the owner file goes, and
            # purge's final leftovers check must not see that new cluster.
            with _machine_lock():
                purge()
        finally:
            self.workdir = None
            self._sshd.clear()
            self._cut.clear()
            self._daemons.clear()

    def _bring_up(self) -> None:
        # The safety route first: from here on nothing addressed to the range can leave through eth0.
        _run([tool("ip"), "route", "replace", *SAFETY_ROUTE])
        keygen = self._start_keygen()  # overlaps with the network setup
        self._make_network()
        self._make_uts()
        self._write_hosts()
        self._write_ssh_files(keygen)
        self._start_sshds(self.nodes)

    def _start_keygen(self) -> list[subprocess.Popen]:
        (self._wd / "ssh").mkdir(mode=0o700)
        keygen = tool("ssh-keygen")
        return [
            subprocess.Popen(
                [keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"{TAG}-{self.id}-{kind}", "-f", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for kind, path in (("host", self._wd / "ssh" / "host_ed25519_key"), ("client", self.identity))
        ]

    def _make_network(self) -> None:
        ip = tool("ip")
        batch = [f"link add {BRIDGE} type bridge", f"addr add {BRIDGE_ADDRESS}/{PREFIX_LEN} dev {BRIDGE}"]
        batch.append(f"link set {BRIDGE} up")
        for node in self.nodes:
            batch += [
                f"netns add {node.netns}",
                f"link add {node.host_veth} type veth peer name {IFACE} netns {node.netns}",
                f"link set {node.host_veth} master {BRIDGE} up",
            ]
        _run([ip, "-batch", "-"], stdin="\n".join(batch) + "\n")
        # Inside each namespace: no default route, only the connected /24 (and loopback).
        _run_parallel(
            [[ip, "-n", node.netns, "-batch", "-"] for node in self.nodes],
            stdins=[
                f"link set lo up\naddr add {node.address}/{PREFIX_LEN} dev {IFACE}\nlink set {IFACE} up\n"
                for node in self.nodes
            ],
        )

    def _make_uts(self) -> None:
        uts_dir = self._wd / "uts"
        uts_dir.mkdir()
        _bind_private(uts_dir)
        for node in self.nodes:
            Path(node.uts).touch()  # the bind-mount target must exist
        unshare, hostname = tool("unshare"), tool("hostname")
        _run_parallel([[unshare, f"--uts={node.uts}", hostname, node.name] for node in self.nodes])

    def _write_hosts(self) -> None:
        names = {node.name for node in self.nodes}
        for lineno, line in enumerate(HOSTS.read_text().splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            clash = names.intersection(fields[1:])
            if clash and f"# {TAG} " not in line:
                raise ClusterError(f"{HOSTS}:{lineno}: {line!r} already maps {sorted(clash)[0]}; remove that line")
        _rewrite_hosts(lambda line: True, [f"{node.address}\t{node.name}\t# {TAG} {self.id}\n" for node in self.nodes])

    def _write_ssh_files(self, keygen: list[subprocess.Popen]) -> None:
        for proc in keygen:
            out, _ = proc.communicate(timeout=30)
            if proc.returncode != 0:
                raise ClusterError(f"ssh-keygen exited {proc.returncode}: {out.strip()}")
        ssh_dir = self._wd / "ssh"
        host_key = (ssh_dir / "host_ed25519_key.pub").read_text().split()
        (ssh_dir / "authorized_keys").write_text((ssh_dir / "id_ed25519.pub").read_text())
        self.known_hosts.write_text(
            "".join(f"{node.name},{node.address} {host_key[0]} {host_key[1]}\n" for node in self.nodes)
        )
        (self._wd / "sshd_config").write_text(
            f"""# {TAG} {self.id}: one sshd per node, started in the node's namespaces
Port {SSH_PORT}
AddressFamily inet
HostKey {ssh_dir / "host_ed25519_key"}
AuthorizedKeysFile {ssh_dir / "authorized_keys"}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# PAM would need a session stack; StrictModes would refuse keys under a world-writable parent.
UsePAM no
StrictModes no
# pdsh and mpirun open many connections at once; the default 10:30:100 drops some.
MaxStartups 256:30:512
MaxSessions 64
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
Subsystem sftp internal-sftp
# Debian's bash then skips root's ~/.bashrc (pyenv init: ~0.35 s per command); remote PATH stays the system one.
SetEnv SHLVL=1
# The post-quantum default costs ~150 ms per handshake; without it clients settle on curve25519.
KexAlgorithms -sntrup*,mlkem*
LogLevel INFO
"""
        )
        hosts = " ".join([node.name for node in self.nodes] + [node.address for node in self.nodes])
        block = f"""# {TAG} {self.id}: written by tests/cluster/harness.py, removed on teardown
Host {hosts}
    User root
    IdentityFile {self.identity}
    IdentitiesOnly yes
    UserKnownHostsFile {self.known_hosts}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    UpdateHostKeys no
    BatchMode yes
    ConnectTimeout 5
    LogLevel ERROR
"""
        self.ssh_config.write_text(block)
        self.ssh_config.chmod(0o600)
        DROP_IN.parent.mkdir(parents=True, exist_ok=True)
        tmp = DROP_IN.with_name(f".{DROP_IN.name}.{self.id}")
        tmp.write_text(block)
        tmp.chmod(0o644)
        tmp.replace(DROP_IN)

    def _start_sshds(self, nodes: Sequence[Node]) -> None:
        if not PRIVSEP_DIR.is_dir():
            PRIVSEP_DIR.mkdir(mode=0o755)
            (self._wd / "created-privsep-dir").touch()
        sshd = tool("sshd")  # absolute: sshd re-executes itself
        commands = []
        for node in nodes:
            node_dir = self._wd / node.name
            node_dir.mkdir(exist_ok=True)
            (node_dir / "sshd.pid").unlink(missing_ok=True)
            commands.append(
                self.node_argv(
                    node,
                    [
                        sshd,
                        "-f",
                        str(self._wd / "sshd_config"),
                        "-E",
                        str(node_dir / "sshd.log"),
                        "-o",
                        f"PidFile={node_dir / 'sshd.pid'}",
                    ],
                )
            )
        _run_parallel(commands)  # each exits once its sshd has daemonised
        # sshd writes its pid file after it listens: that is the readiness signal.
        deadline = time.monotonic() + 10
        for node in nodes:
            pidfile = self._wd / node.name / "sshd.pid"
            while True:
                with contextlib.suppress(OSError, ValueError):
                    pid = int(pidfile.read_text())
                    stat = _proc_stat(pid)
                    if stat is not None:
                        self._sshd[node.name] = (pid, stat[1])
                        break
                if time.monotonic() > deadline:
                    log = (self._wd / node.name / "sshd.log").read_text(errors="replace").strip()
                    raise ClusterError(f"sshd on {node.name} did not start within 10 s; its log: {log[-2000:]}")
                time.sleep(0.005)

    # -- helpers for tests -----------------------------------------------------------------------------------

    def node(self, ref: NodeRef) -> Node:
        """A node by `Node`, name ("node2") or 1-based index (2)."""
        if isinstance(ref, Node):
            return ref
        for node in self.nodes:
            if ref in (node.name, node.index):
                return node
        raise KeyError(f"no node {ref!r}; nodes: {', '.join(n.name for n in self.nodes) or '(cluster down)'}")

    def node_argv(self, node: NodeRef, argv: Sequence[str]) -> list[str]:
        """The argv that runs `argv` on `node` (its netns and UTS namespace) from the root namespace."""
        if isinstance(argv, str):
            raise TypeError("argv must be a list of strings; for a shell command pass ['sh', '-c', cmd]")
        node = self.node(node)
        return [tool("ip"), "netns", "exec", node.netns, tool("nsenter"), f"--uts={node.uts}", "--", *argv]

    def run_on(self, node: NodeRef, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """subprocess.run on a node; defaults: capture_output, text, timeout=60 (any can be overridden)."""
        if not {"stdout", "stderr"} & kwargs.keys():
            kwargs.setdefault("capture_output", True)
        if not {"encoding", "errors", "universal_newlines"} & kwargs.keys():
            kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        return subprocess.run(self.node_argv(node, argv), **kwargs)

    def popen_on(self, node: NodeRef, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """subprocess.Popen on a node; the returned pid is the command itself (both wrappers exec)."""
        return subprocess.Popen(self.node_argv(node, argv), **kwargs)

    def ssh_argv(self, node: NodeRef, command: Sequence[str] | str) -> list[str]:
        """``ssh -F <ssh_config> -- nodeI <command>``; a list is quoted for the remote shell, a str is sent as is."""
        remote = command if isinstance(command, str) else shlex.join(command)
        return [tool("ssh"), "-F", str(self.ssh_config), "--", self.node(node).name, remote]

    def ssh(self, node: NodeRef, command: Sequence[str] | str, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run `command` on `node` over real ssh; same defaults as `run_on` (timeout 30)."""
        if not {"stdout", "stderr"} & kwargs.keys():
            kwargs.setdefault("capture_output", True)
        if not {"encoding", "errors", "universal_newlines"} & kwargs.keys():
            kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.ssh_argv(node, command), **kwargs)

    def pids(self, node: NodeRef, *, include_zombies: bool = False) -> list[int]:
        """Processes in the node's network namespace (`ip netns pids`); zombies count as gone."""
        return netns_pids(self.node(node).netns, include_zombies=include_zombies)

    processes_with_marker = staticmethod(processes_with_marker)

    def sshd_pid(self, node: NodeRef) -> int | None:
        """Pid of the node's listening sshd, None if it is not running (killed node)."""
        entry = self._sshd.get(self.node(node).name)
        return entry[0] if entry and _running(*entry) else None

    def keep_daemon(self, pid: int) -> None:
        """Let ``ensure_healthy`` keep this node process (e.g. a slurmd) like the sshds; its children still go."""
        stat = _proc_stat(pid)
        if stat is not None:
            self._daemons[pid] = stat[1]

    def kill_node(self, node: NodeRef, *, power_loss: bool = False) -> None:
        """Node death: SIGKILL everything in the namespace (its sshd too); peers see resets at once.

        ``power_loss=True`` cuts the link first, so peers notice only through timeouts.  `revive` restarts sshd.
        """
        node = self.node(node)
        if power_loss:
            self.cut(node)
        _kill_until_gone(lambda: netns_pids(node.netns))

    def revive(self, node: NodeRef) -> None:
        """Heal the link if cut and start the node's sshd again if it is not running."""
        node = self.node(node)
        if node.name in self._cut:
            self.heal(node)
        if self.sshd_pid(node) is None:
            self._start_sshds([node])

    def cut(self, node: NodeRef) -> None:
        """Network cut: the host-side veth goes down; processes on the node keep running."""
        node = self.node(node)
        _run([tool("ip"), "link", "set", node.host_veth, "down"])
        self._cut.add(node.name)

    def heal(self, node: NodeRef) -> None:
        """Undo `cut` and flush ARP on the bridge and in every node (else "No route to host" for a while)."""
        node = self.node(node)
        ip = tool("ip")
        _run([ip, "link", "set", node.host_veth, "up"])
        self._cut.discard(node.name)
        _run_parallel(
            [[ip, "neigh", "flush", "dev", BRIDGE]]
            + [[ip, "-n", n.netns, "neigh", "flush", "dev", IFACE] for n in self.nodes]
        )

    @contextlib.contextmanager
    def cpu_limited(self, node: NodeRef, share: float) -> Iterator[Path]:
        """A throttled node: every process on it (its sshd, so every session and job started on it from now on)
        in a cgroup of its own allowed ``share`` of one core per 100 ms CFS period, all together (cgroup v2's
        ``cpu.max``, or v1's ``cpu.cfs_quota_us``, whichever holds the cpu controller: `cpu_controller`).  On
        leaving, whatever runs in it goes back to the sshd's own cgroup and the cgroup is removed, also when the
        body raised; a cgroup left by a killed owner goes with the next `purge`.  Yields the cgroup's path."""
        controller = cpu_controller()
        if controller is None:
            raise ClusterError("no cpu controller where a cgroup can limit CPU bandwidth (cgroup v2 with cpu in the "
                               "root's cgroup.subtree_control, or v1's cpu hierarchy)")
        node = self.node(node)
        sshd = self.sshd_pid(node)
        home = controller.group_of(sshd) if sshd is not None else None
        if home is None:
            raise ClusterError(f"{node.name} runs no sshd to put under a CPU limit")
        group = controller.root / f"{self._wd.name}-{node.name}"
        group.mkdir()
        try:
            controller.limit(group, share)
            deadline = time.monotonic() + 5
            # until every process of the node is in: one that forked as its parent moved is caught by the next pass
            while outside := [p for p in self.pids(node) if controller.group_of(p) not in (group, None)]:
                if time.monotonic() > deadline:
                    raise ClusterError(f"processes on {node.name} stay outside {group}: {outside}")
                for pid in outside:
                    _move(pid, group)
            yield group
        finally:
            _remove_cgroup(group, home)

    def ensure_healthy(self, *, kill_strays: bool = True) -> None:
        """Bring the cluster (back) to a fresh state: up, links healed, every sshd running, and (unless
        ``kill_strays=False``) nothing else running on the nodes.  The shared pytest fixture calls it before
        every test, so a test that kills or cuts nodes leaves no trace for the next one."""
        if not self.is_up:
            self.up()
            return
        for name in sorted(self._cut):
            self.heal(name)
        dead = [node for node in self.nodes if self.sshd_pid(node) is None]
        if kill_strays:
            keep = {pid for pid, _ in self._sshd.values()}
            keep |= {pid for pid, start in self._daemons.items() if _running(pid, start)}
            _kill_until_gone(lambda: [p for node in self.nodes for p in netns_pids(node.netns)], keep=keep)
        if dead:
            self._start_sshds(dead)

    def hostfile(self, path: str | os.PathLike[str], slots: int = 2, nodes: Iterable[NodeRef] | None = None) -> Path:
        """Write an xrun hostfile (``nodeI slots=N`` lines) for all or some nodes; returns the path."""
        chosen = [self.node(ref) for ref in nodes] if nodes is not None else list(self.nodes)
        path = Path(path)
        path.write_text("".join(f"{node.name} slots={slots}\n" for node in chosen))
        return path

    # -- state file (CLI) ------------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "tag": TAG,
            "id": self.id,
            "workdir": str(self._wd),
            "nodes": [asdict(node) for node in self.nodes],
            "ssh_config": str(self.ssh_config),
            "known_hosts": str(self.known_hosts),
            "identity": str(self.identity),
            "drop_in": str(DROP_IN),
            "bridge": BRIDGE,
            "bridge_address": BRIDGE_ADDRESS,
            "iface": IFACE,
            "subnet": SUBNET,
            "sshd_pids": {name: pid for name, (pid, _) in self._sshd.items()},
            "timings": self.timings,
        }

    @classmethod
    def from_state(cls, path: str | os.PathLike[str]) -> Cluster:
        """A handle on a cluster that `harness up` left running (its `down` tears it down)."""
        state = json.loads(Path(path).read_text())
        cluster = cls(len(state["nodes"]), detach=True, state=str(path))
        cluster.workdir = Path(state["workdir"])
        cluster.nodes = tuple(Node(**node) for node in state["nodes"])
        for name, pid in state.get("sshd_pids", {}).items():
            stat = _proc_stat(pid)
            if stat is not None:
                cluster._sshd[name] = (pid, stat[1])
        return cluster


@atexit.register
def _down_on_exit() -> None:
    """Safety net for a process that exits with a cluster up (a test that forgot `down`)."""
    for cluster in list(_IN_PROCESS):
        if cluster._owner_pid == os.getpid():  # never from a forked child
            with contextlib.suppress(Exception):
                cluster.down()


# ---------------------------------------------------------------------------------------------------------------
# CLI


def _cmd_up(args: argparse.Namespace) -> int:
    state = Path(args.state).resolve()
    cluster = Cluster(args.nodes, busy_timeout=args.wait, detach=True, state=str(state))
    try:
        cluster.up()
    except ClusterBusy as e:
        print(f"harness up: {e}", file=sys.stderr)
        return 1
    state.write_text(json.dumps(cluster.to_state(), indent=2) + "\n")
    width = max(len(node.name) for node in cluster.nodes)
    print(f"xrun test cluster up: {cluster.n} nodes in {cluster.timings['up']:.2f} s (state: {state})")
    for node in cluster.nodes:
        print(f"  {node.name:<{width}}  {node.address:<12}  netns {node.netns}")
    print(f"interface {IFACE} on every node; bridge {BRIDGE} {BRIDGE_ADDRESS}/{PREFIX_LEN} in the root namespace")
    print(f"try:   ssh -F {cluster.ssh_config} node1 hostname")
    print(f"       (plain ssh, pdsh -R ssh -w node[1-{cluster.n}], mpirun use {DROP_IN} without flags)")
    print(f"note:  the remote PATH is the system one; use absolute interpreters, e.g. {sys.executable}")
    print(f"down:  python -m tests.cluster.harness down --state {state}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    state = Path(args.state) if args.state else None
    start = time.monotonic()
    with _machine_lock():
        mine = json.loads(state.read_text())["workdir"] if state is not None and state.exists() else None
        others = [_describe_owner(w, o) for w, o in _live_owners() if str(w) != mine]
        if others and not args.force:
            print("harness down: not touching live clusters (use --force): " + "; ".join(others), file=sys.stderr)
            return 1
        purge()
    if state is not None:
        state.unlink(missing_ok=True)
    print(f"xrun test cluster down in {time.monotonic() - start:.2f} s; nothing tagged {TAG!r} left")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    live, left = live_clusters(), leftovers()
    for desc in live:
        print(f"live: {desc}")
    for item in left:
        print(f"tagged: {item}")
    if not left:
        print(f"nothing tagged {TAG!r} on this machine")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.harness", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="bring up N nodes and leave them running")
    up.add_argument("nodes", type=int, help=f"number of nodes (1..{MAX_NODES})")
    up.add_argument("--state", default="/tmp/xrun-cluster.json", help="where to write the state (JSON)")
    up.add_argument("--wait", type=float, default=0.0, help="seconds to wait for another live cluster")
    up.set_defaults(func=_cmd_up)
    down = sub.add_parser("down", help="tear down the cluster and anything a crashed run left behind")
    down.add_argument("--state", help="the state file `up` wrote (removed afterwards)")
    down.add_argument("--force", action="store_true", help="also tear down clusters whose owner is alive")
    down.set_defaults(func=_cmd_down)
    status = sub.add_parser("status", help="list live clusters and everything tagged on the machine")
    status.set_defaults(func=_cmd_status)
    args = parser.parse_args(argv)
    problems = missing_requirements()
    if problems:
        parser.error("; ".join(problems))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
