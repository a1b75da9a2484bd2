"""PBS and LSF allocations: inside a batch job the allocation is the hostfile, as for Slurm (``slurm_alloc``).

xrun runs once, in the batch script on the first node, and fans out over the allocation with the default
remote backend (pdsh, else ssh), exactly as with ``-H``. Pure functions over an environment mapping and a
file reader (``xrun.runner.hosts.smallfile.read_small_file`` at the edge, tmp files or literals in tests).

* PBS Pro / Torque (qsub(1B) "Environment variables"): ``PBS_JOBID`` marks a job; ``PBS_NODEFILE`` names a
  file with one line per slot (a host appears once per CPU or MPI process it was given; names are often
  short). Hosts keep the order in which they first appear; each gets as many slots as it has lines.
* LSF (bsub(1), "LSB_DJOB_HOSTFILE", "LSB_MCPU_HOSTS"): ``LSB_JOBID`` marks a job; ``LSB_DJOB_HOSTFILE``
  names the same one-line-per-slot file; older setups only give ``LSB_MCPU_HOSTS`` = ``hostA 4 hostB 4``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from xrun.errors import HostfileError
from xrun.runner.hosts.platform_values import (
    MAX_NODES,
    MAX_SLOTS_PER_NODE,
    PlatformError,
    host_name_problem,
    parse_count,
)
from xrun.runner.hosts.selection import Pool
from xrun.runner.hosts.smallfile import SmallFileError
from xrun.strict_numbers import MAX_RANKS

_SHOWN = 80  # characters of a bad line quoted in an error

ReadFile = Callable[[str], str]  # path -> text; raises SmallFileError


@dataclass(frozen=True)
class BatchAllocation:
    """A PBS or LSF allocation seen from its first node: hosts in the scheduler's order, slots per host."""

    system: str  # "PBS" or "LSF"
    job_id: str
    hosts: tuple[str, ...]
    slots: tuple[int, ...]  # per host, same order
    source: str  # where the hosts came from, e.g. "PBS_NODEFILE=/var/spool/pbs/aux/42.pbs"

    def pool(self) -> Pool:
        return {host: tuple(range(count)) for host, count in zip(self.hosts, self.slots)}

    def describe(self) -> str:
        return (f"xrun: using {self.system} job {self.job_id}: {len(self.hosts)} node(s), {sum(self.slots)} "
                f"slot(s) from {self.source}")


def in_batch_job(env: Mapping[str, str]) -> bool:
    """Inside a Slurm, PBS or LSF job: the scheduler, not the user, set these."""
    return any(env.get(marker, "").strip() for marker in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"))


def count_node_file(text: str, path: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``hA\\nhA\\nhB\\n`` -> ``(("hA", "hB"), (2, 1))``; a bad line is a ``HostfileError`` naming FILE:LINE."""
    counts: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        name = line.strip()
        if not name:
            continue
        problem = host_name_problem(name)
        if problem:
            raise HostfileError(path, lineno, line[:_SHOWN], f"{problem}; expected one host name per line")
        if name not in counts and len(counts) == MAX_NODES:
            raise HostfileError(path, lineno, line, f"more than {MAX_NODES} hosts")
        counts[name] = counts.get(name, 0) + 1
        if counts[name] > MAX_SLOTS_PER_NODE:
            raise HostfileError(path, lineno, line, f"host {name!r} has more than {MAX_SLOTS_PER_NODE} slots")
    if not counts:
        raise HostfileError(path, None, None, "lists no hosts")
    return tuple(counts), tuple(counts.values())


def mcpu_hosts(text: str, variable: str = "LSB_MCPU_HOSTS") -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``hA 4 hB 4`` -> ``(("hA", "hB"), (4, 4))``."""
    tokens = text.split()
    if not tokens or len(tokens) % 2:
        raise PlatformError(variable, text, "expected pairs 'HOST SLOTS', e.g. 'hostA 4 hostB 4'")
    if len(tokens) // 2 > MAX_NODES:
        raise PlatformError(variable, text, f"lists more than {MAX_NODES} hosts")
    hosts: dict[str, int] = {}
    for name, count in zip(tokens[0::2], tokens[1::2]):
        problem = host_name_problem(name)
        if problem:
            raise PlatformError(variable, text, problem)
        if name in hosts:
            raise PlatformError(variable, text, f"names host {name!r} twice")
        hosts[name] = parse_count(variable, count, low=1, high=MAX_SLOTS_PER_NODE, what=f"the slots of {name}")
    if sum(hosts.values()) > MAX_RANKS:  # before the pool lists every slot
        raise PlatformError(variable, text, f"more than {MAX_RANKS} slots in all, the most ranks xrun accepts")
    return tuple(hosts), tuple(hosts.values())


def _node_file(variable: str, env: Mapping[str, str], read: ReadFile) -> tuple[tuple[str, ...], tuple[int, ...]]:
    path = env[variable].strip()
    try:
        text = read(path)
    except SmallFileError as err:
        raise PlatformError(variable, path, err.reason) from None
    return count_node_file(text, path)


def pbs_allocation(env: Mapping[str, str], read: ReadFile) -> BatchAllocation | None:
    job_id = env.get("PBS_JOBID", "").strip()
    if not job_id:
        return None
    if not env.get("PBS_NODEFILE", "").strip():
        raise PlatformError("PBS_NODEFILE", "", "not set although PBS_JOBID is; pass -H HOSTFILE")
    hosts, slots = _node_file("PBS_NODEFILE", env, read)
    return BatchAllocation("PBS", job_id, hosts, slots, f"PBS_NODEFILE={env['PBS_NODEFILE'].strip()}")


def lsf_allocation(env: Mapping[str, str], read: ReadFile) -> BatchAllocation | None:
    job_id = env.get("LSB_JOBID", "").strip()
    if not job_id:
        return None
    if env.get("LSB_DJOB_HOSTFILE", "").strip():
        hosts, slots = _node_file("LSB_DJOB_HOSTFILE", env, read)
        return BatchAllocation("LSF", job_id, hosts, slots, f"LSB_DJOB_HOSTFILE={env['LSB_DJOB_HOSTFILE'].strip()}")
    if env.get("LSB_MCPU_HOSTS", "").strip():
        hosts, slots = mcpu_hosts(env["LSB_MCPU_HOSTS"])
        return BatchAllocation("LSF", job_id, hosts, slots, "LSB_MCPU_HOSTS")
    raise PlatformError("LSB_DJOB_HOSTFILE", "", "not set (nor LSB_MCPU_HOSTS) although LSB_JOBID is; pass -H HOSTFILE")
