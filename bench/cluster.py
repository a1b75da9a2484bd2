"""The namespace test cluster for scenarios 7 and 8, and the multi-node argv of each launcher.

The cluster is the project's own harness (``tests/cluster/harness.py``): N network namespaces with their own
sshd on this machine. They share the filesystem and the PID space, so the rank pid files and /proc scans of
the local scenarios work unchanged. One cluster per machine: when another owner holds it, the scenario waits
``busy_timeout_s`` and then reports "not available" rather than fail.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
from collections.abc import Iterator
from typing import Any

from bench.launchers import xrun_help


class Unavailable(Exception):
    """Why a cluster scenario cannot run here; the report prints it as "not available: ..."."""


def xrun_backends() -> set[str]:
    """Backends that `xrun --help` lists for --launcher (e.g. {"local", "ssh", "pdsh"})."""
    text = xrun_help() or ""
    start = text.find("--launcher")
    if start < 0:
        return set()
    nxt = text.find("\n  -", start + 1)
    chunk = text[start : nxt if nxt > 0 else None]
    return {name for name in ("local", "ssh", "pdsh", "openmpi", "mpich", "slurm") if name in chunk}


def requirements(tools: tuple[str, ...] = ("pdsh", "ssh")) -> list[str]:
    try:
        from tests.cluster import harness
    except ImportError as err:
        return [f"tests/cluster/harness.py cannot be imported ({err}); run from the repository root"]
    problems = list(harness.missing_requirements())
    problems += [f"{tool} not installed" for tool in tools if shutil.which(tool) is None]
    return problems


@contextlib.contextmanager
def cluster(n: int, *, busy_timeout_s: float, state: str | None = None) -> Iterator[Any]:
    """A cluster of at least ``n`` nodes: the one in ``state`` (left up by ``harness up``) or a fresh one."""
    problems = requirements()
    if problems:
        raise Unavailable("; ".join(problems))
    from tests.cluster import harness

    if state:
        found = harness.Cluster.from_state(state)
        if len(found.nodes) < n:
            raise Unavailable(f"the cluster in {state} has {len(found.nodes)} nodes, {n} needed")
        yield found  # not ours to tear down
        return
    try:
        with harness.Cluster(n, busy_timeout=busy_timeout_s) as fresh:
            yield fresh
    except harness.ClusterBusy as err:
        raise Unavailable(f"cluster busy: {err}") from None


def node_names(k: int) -> list[str]:
    return [f"node{i}" for i in range(1, k + 1)]


def pdsh_argv(hosts: list[str], command: list[str]) -> list[str]:
    # pdsh -S: exit with the largest remote exit code; -f 32: fan-out width the issue compares against.
    return ["pdsh", "-S", "-f", "32", "-w", ",".join(hosts), shlex.join(command)]


def sequential_ssh_argv(hosts: list[str], command: list[str]) -> list[str]:
    remote = shlex.quote(shlex.join(command))
    loop = "; ".join(f"ssh {shlex.quote(h)} {remote} || exit $?" for h in hosts)
    return ["bash", "-c", loop]


def xrun_cluster_argv(
    backend: str, hostfile: str, port: int, script: str, args: tuple[str, ...], *, ssh_config: str
) -> list[str]:
    argv = ["xrun", "-H", hostfile, "--launcher", backend, "--master_addr", "node1", "--master_port", str(port)]
    if backend == "ssh":  # paramiko reads no ssh_config.d drop-in: give it the cluster's config (known_hosts)
        argv += ["--ssh_config", ssh_config]
    return [*argv, script, *args]


def deepspeed_cluster_argv(hostfile: str, port: int, script: str, args: tuple[str, ...]) -> list[str]:
    return ["deepspeed", "-H", hostfile, "--launcher", "pdsh", "--master_addr", "node1", "--master_port", str(port),
            script, *args]  # fmt: skip
