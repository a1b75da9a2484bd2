"""The planner: the parsed request in, the plan out. ``plan_job`` is the whole path, in the order it reads:

1. ``find_hosts``: where the nodes come from, each source asked once, the first that answers wins: pod flags or
   a platform's variables (``xrun.runner.pod.placement.place_job``: it detects the platform, PBS or LSF, only
   when a flag or a platform's variable is present), else ``-H HOSTFILE``, else the Slurm allocation around this
   xrun, else this machine. The answer (``Hosts``) carries the request in planner terms and the Slurm allocation
   it used, so that the backend choice does not ask again;
2. ``select``: ``--include``/``--exclude``/``--num_nodes``/``--num_gpus`` over that pool;
3. ``choose_backend``: pod mode, ``--launcher``, srun inside the allocation, local, pdsh, ssh;
4. the request steps that read this machine (a local run's free port and ``--export``; a remote run's
   environment), then ``make_plan`` (pure).

This is the edge of planning: the environment, the files and the devices are read here (``node_io``) and handed
to pure functions, and the one-line notices (the allocation's, the platform's, a device notice) go to stderr here.
The backend renders the plan; ``xrun.runner.cli.main`` wires parse -> plan -> validate -> print or execute.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial

from xrun.common.rankplan import World
from xrun.errors import UsageError
from xrun.net import free_port
from xrun.runner import envpass
from xrun.runner.backends import backend_traits, engine_backends
from xrun.runner.hosts.hostfile import read_hostfile
from xrun.runner.hosts.selection import Pool, Selection, select
from xrun.runner.hosts.slurm_alloc import Allocation, discover_allocation, in_allocation
from xrun.runner.hosts.smallfile import read_small_file
from xrun.runner.hosts.this_machine import LOCAL_ADDR, LOCALHOST, local_pool
from xrun.runner.plan import JobRequest, Plan, PortChoice, make_plan
from xrun.runner.pod.placement import NODE_FILE_LIMIT, NodeIO, place_job


@dataclass(frozen=True)
class Hosts:
    """Where the nodes come from, found once."""

    request: JobRequest  # in planner terms: pod mode rewritten, a PBS/LSF allocation's hosts named
    pool: Pool
    allocation: Allocation | None = None  # the pool is this Slurm allocation (srun starts the agents by default)


def plan_job(request: JobRequest) -> Plan:
    """The request -> the plan (see the module doc for the steps); prints where the nodes came from."""
    environ = os.environ  # read here and passed down: the steps below take it as an argument
    hosts = find_hosts(request, environ)
    request = hosts.request
    world = select(hosts.pool, request.selection)
    backend = choose_backend(request, world, slurm=hosts.allocation is not None)
    traits = backend_traits(backend)
    if request.remote.launcher_args and not traits.engine:
        raise UsageError("--launcher_args", f"applies to {', '.join(engine_backends())}, not to {backend!r}")
    if traits.local:
        request = with_local_exports(with_replica_ports(with_free_port(request)), environ)
    else:
        request = with_exports(request, environ)
    return make_plan(request, world, backend)


def find_hosts(request: JobRequest, environ: Mapping[str, str]) -> Hosts:
    """The host pool, from the first source that answers (see the module doc); prints that source's line."""
    io = node_io(environ, request.selection)
    placement = place_job(request, environ, io)  # --hosts, pod mode, PBS/LSF (xrun.runner.pod.placement)
    if placement is not None:
        if placement.announcement:
            print(placement.announcement, file=sys.stderr)
        request = placement.request
        if placement.pool is not None:
            return Hosts(request, placement.pool)
    if request.hostfile is not None:
        return Hosts(request, io.hostfile_pool(request.hostfile))
    if uses_slurm_allocation(request, environ):
        allocation = discover_allocation(environ)
        print(allocation.describe(), file=sys.stderr)
        return Hosts(request, allocation.pool(), allocation)
    return Hosts(request, io.local_pool())


def node_io(environ: Mapping[str, str], selection: Selection) -> NodeIO:
    """This machine's reads: platform files (size-capped), ``-H``'s hostfile, and its own slots."""

    def this_machine() -> Pool:
        found = local_pool(environ, selection)
        if found.notice:
            print(found.notice, file=sys.stderr)
        return found.pool

    return NodeIO(read_file=partial(read_small_file, limit=NODE_FILE_LIMIT), local_pool=this_machine,
                  hostfile_pool=lambda path: read_hostfile(path).pool())


def uses_slurm_allocation(request: JobRequest, environ: Mapping[str, str]) -> bool:
    """No hostfile inside salloc/sbatch: the allocation is the hostfile (``--launcher local`` opts out)."""
    return (
        request.hostfile is None
        and request.pod.hosts is None
        and not request.remote.no_ssh
        and in_allocation(environ)
        and (request.launcher is None or not backend_traits(request.launcher).local)
    )


def choose_backend(request: JobRequest, world: Pool, *, slurm: bool) -> str:
    """``slurm``: the pool is the Slurm allocation around this xrun (``find_hosts`` asked; nobody asks again)."""
    if request.remote.no_ssh:
        return "no_ssh"
    local = is_local_world(world, request.hostfile or request.pod.hosts)
    if request.launcher is not None:
        if backend_traits(request.launcher).local and not local:
            raise UsageError("--launcher", f"{request.launcher!r} runs on this machine only, "
                             f"but the world has {len(world)} hosts")
        return request.launcher
    if slurm:
        return "slurm"
    if local:
        return "local"
    return "pdsh" if shutil.which("pdsh") else "ssh"


def is_local_world(world: World, hostfile: str | None) -> bool:
    """Runs without any remote launcher: no hostfile, or a hostfile naming only this machine."""
    if hostfile is None:
        return True
    return len(world) == 1 and next(iter(world)) in _local_names()


def _local_names() -> set[str]:
    return {LOCALHOST, LOCAL_ADDR, socket.gethostname(), socket.getfqdn()}


# ---------------------------------------------------------------------------------------------------------------
# Request steps that read the machine (I/O at the edge, before the pure make_plan).


def with_free_port(request: JobRequest) -> JobRequest:
    """No ``--master_port`` (or 0) on a local run: a port free on loopback now, so two jobs on one machine never
    meet on 29500 (remote runs agree on one at the barrier)."""
    if request.master_port == 0 or request.master_port_choice is PortChoice.FREE:
        return replace(request, master_port=free_port(LOCAL_ADDR), master_port_choice=PortChoice.FREE)
    return request


def with_replica_ports(request: JobRequest) -> JobRequest:
    """``--replica_groups G`` without ``--master_port`` on a local run: each group's port and the Lighthouse's
    free on loopback now, all different (group 0's is the master port drawn before)."""
    if request.replicas is None or request.master_port_choice is not PortChoice.FREE:
        return request
    ports = [request.master_port]
    while len(ports) < request.replicas.groups + 1:
        port = free_port(LOCAL_ADDR)
        if port not in ports:
            ports.append(port)
    return replace(request, replicas=replace(request.replicas, ports=tuple(ports)))


def with_local_exports(request: JobRequest, environ: Mapping[str, str]) -> JobRequest:
    """A local run's ``--export``: checked like a remote run's, and set for the ranks (the rest of the environment
    is theirs already)."""
    exports = dict(envpass.parse_export(spec, environ) for spec in request.remote.exports)
    return replace(request, env=exports) if exports else request


def with_exports(request: JobRequest, environ: Mapping[str, str]) -> JobRequest:
    """Collect the environment for remote nodes (``environ`` and the env files)."""
    cwd = request.cwd or os.getcwd()
    env = envpass.collect(
        environ,
        exports=request.remote.exports,
        files=envpass.env_files(environ.get("HOME"), cwd),
        cwd=cwd,
    )
    return replace(request, env=env)
