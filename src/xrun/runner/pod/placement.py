"""Where the nodes come from: request + platform detection -> the host pool, and the request in planner terms.

``place`` is pure (the environment and every file or device read come in as arguments: ``NodeIO``); the
planner (``xrun.runner.planner``) calls it through ``place_job``, which answers None at once when no pod flag is
given and no platform variable is present. The platform is detected here, once. Three outcomes:

* **head mode** (xrun fans out): ``--hosts PATTERN`` or a PBS/LSF allocation gives the pool; otherwise the
  pool is left to the planner (hostfile, Slurm allocation, this machine) and nothing changes;
* **pod mode** (``--pod``, ``--no_ssh``, or a detected pod platform: every node runs xrun itself): the pool is
  ``-H``/``--hosts``/the platform's host list, else ``node0..nodeN-1`` when the platform gives only a count
  (the master address must then come from the platform or ``--master_addr``), else this machine. Flags win
  over detected values. The request is rewritten in today's terms: ``no_ssh`` with this node's rank, the
  master, and a run id every node computes alike (``xrun-MASTER-PORT``) unless ``--run_id`` is given.
  The runtime is the ``no_ssh`` backend's (``xrun.joined.pod``);
* ``pod_setup(plan, token=...)`` then gives the pod-mode runtime what it needs (``PodSetup``): this node's
  rank, the world, the master, node 0's control endpoint (``--control_port``, default master port - 1), the
  token and the plan digest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from xrun.common.rankplan import World
from xrun.errors import SelectionError, UsageError
from xrun.hostlist import HostlistSyntaxError, expand_hostlist
from xrun.runner.hosts.batch_alloc import ReadFile
from xrun.runner.hosts.platform_values import MAX_NODES, MAX_SLOTS_PER_NODE, host_name_problem
from xrun.runner.hosts.selection import Pool
from xrun.runner.plan import JobRequest, Plan, PortChoice
from xrun.runner.pod.digest import PlanDigest, plan_digest
from xrun.runner.pod.options import PlatformChoice
from xrun.runner.pod.platforms import Detection, detect, platform_markers_present
from xrun.runner.pod.secret import load_token
from xrun.runner.replica_options import counted_ports

NODE_FILE_LIMIT = 16 << 20  # a line per slot: 16 MiB is some 500 000 slots of 32-character names


@dataclass(frozen=True)
class NodeIO:
    """The reads that finding the nodes may need (a platform's files, ``-H``'s hostfile, this machine's slots),
    passed in as functions so that ``place`` stays pure. The planner builds the real ones once per run and uses
    the same ones where no pod flag or platform applies, so each source is read one way."""

    read_file: ReadFile  # platform files: node lists, /etc/volcano/*.host
    local_pool: Callable[[], Pool]  # this machine: {"localhost": its slots}
    hostfile_pool: Callable[[str], Pool]  # -H PATH


@dataclass(frozen=True)
class Placement:
    request: JobRequest  # pod mode: rewritten as no_ssh + node rank + master + run id
    pool: Pool | None  # None: the planner's own lookup (hostfile, Slurm allocation, this machine)
    announcement: str | None = None  # the one line for stderr


@dataclass(frozen=True)
class _Hosts:
    pool: Pool
    origin: str  # for messages: "-H", "--hosts", the platform's variables, "this machine"
    named: bool  # False: numbered node0..nodeN-1, nobody can resolve them


def place_job(request: JobRequest, environ: Mapping[str, str], io: NodeIO) -> Placement | None:
    """``place``'s answer, or None when no pod flag is given and no platform can be detected (a plain run: the
    planner looks the pool up itself)."""
    pod = request.pod
    asked = pod.pod or pod.hosts is not None or pod.control_port is not None or pod.token_file is not None
    asked = asked or request.remote.no_ssh or request.remote.node_rank is not None
    if not asked and (pod.platform is PlatformChoice.NONE or not platform_markers_present(environ)):
        return None
    return place(request, environ, io)


def place(request: JobRequest, env: Mapping[str, str], io: NodeIO) -> Placement:
    """Pure: what the flags and the environment say about the nodes, in planner terms (see the module doc)."""
    detection = _detect(request, env, io.read_file)
    pod_mode = request.pod.pod or request.remote.no_ssh or (detection is not None and detection.platform.pod)
    _check_flags(request, pod_mode)
    if not pod_mode:
        return _head(request, detection, io)
    return _pod(request, detection, io)


def _detect(request: JobRequest, env: Mapping[str, str], read: ReadFile) -> Detection | None:
    if request.pod.platform is PlatformChoice.NONE:
        return None
    by_hand = request.pod.pod or request.remote.no_ssh
    # Like Slurm's: a batch allocation is the pool only when no hosts are named and xrun fans out.
    batch = request.hostfile is None and request.pod.hosts is None and request.launcher != "local" and not by_hand
    # A chosen fan-out backend (--launcher) means this xrun is the head: no pod platform applies.
    return detect(env, read, pods=request.launcher is None, batch=batch)


def _check_flags(request: JobRequest, pod_mode: bool) -> None:
    if request.pod.pod and request.launcher is not None:
        raise UsageError("--pod", "cannot be combined with --launcher (each node runs its own share)")
    if pod_mode:
        return
    if request.remote.node_rank is not None:
        raise UsageError("--node_rank", "only applies with --no_ssh or --pod (xrun started on every node), or on a "
                                        "detected pod platform")
    for flag, value in (("--control_port", request.pod.control_port), ("--token_file", request.pod.token_file)):
        if value is not None:
            raise UsageError(flag, "only applies in pod mode (--pod, --no_ssh, or a detected pod platform)")


def _head(request: JobRequest, detection: Detection | None, io: NodeIO) -> Placement:
    if request.pod.hosts is not None:
        return Placement(request, _pattern_pool(request.pod.hosts, _slots(request, None, io)))
    if detection is None or detection.pool is None:
        return Placement(request, None)
    # A batch allocation: its hosts are named as if by --hosts, so the backend choice treats them as a host list.
    pod = replace(request.pod, hosts=",".join(detection.hosts), detected=detection)
    return Placement(replace(request, pod=pod), detection.pool, detection.announcement)


def _pod(request: JobRequest, detection: Detection | None, io: NodeIO) -> Placement:
    hosts = _pod_hosts(request, detection, io)
    _check_count(request, detection, hosts)
    node_rank = _node_rank(request, detection, len(hosts.pool))
    master_addr = request.master_addr or (detection.master_addr if detection else None)
    if master_addr is None and not hosts.named:
        raise UsageError("--master_addr", f"needed: {hosts.origin} gives a node count but no host names, so node "
                                          "0's address must be given (MASTER_ADDR or --master_addr)")
    master_port, choice = request.master_port, request.master_port_choice
    if detection is not None and detection.master_port is not None and "--master_port" not in request.pod.explicit:
        master_port, choice = detection.master_port, PortChoice.GIVEN  # the platform opened that one
    run_id = request.run_id
    if "--run_id" not in request.pod.explicit:  # every node must compute the same id without talking
        run_id = f"xrun-{master_addr or next(iter(hosts.pool))}-{master_port}"
    placed = replace(
        request, master_addr=master_addr, master_port=master_port, master_port_choice=choice, run_id=run_id,
        remote=replace(request.remote, no_ssh=True, node_rank=node_rank),
        pod=replace(request.pod, detected=detection, numbered=not hosts.named),
    )
    control_port(placed)  # checked now, used by the runtime
    return Placement(placed, hosts.pool, _announcement(request, detection))


def _pod_hosts(request: JobRequest, detection: Detection | None, io: NodeIO) -> _Hosts:
    if request.hostfile is not None:
        return _Hosts(io.hostfile_pool(request.hostfile), "-H", named=True)
    if request.pod.hosts is not None:
        return _Hosts(_pattern_pool(request.pod.hosts, _slots(request, detection, io)), "--hosts", named=True)
    if detection is not None and detection.hosts:
        slots = _slots(request, detection, io)
        return _Hosts({host: slots for host in detection.hosts}, detection.source, named=True)
    count = request.selection.num_nodes
    if count is None and detection is not None:
        count = detection.num_nodes
    if count is not None and (detection is not None or request.pod.pod):
        _check_node_count(count)
        slots = _slots(request, detection, io)
        origin = detection.source if detection is not None and not request.selection.num_nodes else "--num_nodes"
        return _Hosts({f"node{k}": slots for k in range(count)}, origin, named=False)
    if detection is not None:
        raise UsageError("--hosts", f"{detection.source} gives this node's index only: name every node with --hosts "
                                    "'NAME-[0-N].SERVICE' or -H HOSTFILE, or give --num_nodes and --master_addr")
    return _Hosts(io.local_pool(), "this machine", named=True)


def _check_node_count(count: int) -> None:
    if not 1 <= count <= MAX_NODES:
        raise SelectionError("--num_nodes", str(count), f"must be in 1..{MAX_NODES}")


def _slots(request: JobRequest, detection: Detection | None, io: NodeIO) -> tuple[int, ...]:
    """Every node's slots: --num_gpus, else the platform's processes per node, else this node's devices."""
    wanted = request.selection.num_gpus
    if wanted is not None:
        if not 1 <= wanted <= MAX_SLOTS_PER_NODE:
            raise SelectionError("--num_gpus", str(wanted), f"must be in 1..{MAX_SLOTS_PER_NODE}")
        return tuple(range(wanted))
    if detection is not None and detection.slots_per_node is not None:
        return tuple(range(detection.slots_per_node))
    return next(iter(io.local_pool().values()))


def _pattern_pool(pattern: str, slots: tuple[int, ...]) -> Pool:
    try:
        hosts = expand_hostlist(pattern, limit=MAX_NODES)
    except HostlistSyntaxError as err:
        raise UsageError("--hosts", str(err)) from None
    for host in hosts:
        problem = host_name_problem(host)
        if problem:
            raise UsageError("--hosts", f"{pattern!r}: {problem}")
    if len(set(hosts)) != len(hosts):
        raise UsageError("--hosts", f"{pattern!r} names a host twice")
    return {host: slots for host in hosts}


def _check_count(request: JobRequest, detection: Detection | None, hosts: _Hosts) -> None:
    """A platform's node count against a host list from the flags: a mismatch is the WORLD_SIZE trap."""
    if detection is None or detection.num_nodes is None or request.selection.num_nodes is not None:
        return
    if request.selection.include is not None or request.selection.exclude is not None:
        return  # the user picks the nodes by name
    if len(hosts.pool) != detection.num_nodes:
        said = f"{detection.platform.title} ({detection.source}) says {detection.num_nodes} node(s)"
        raise UsageError(hosts.origin, f"lists {len(hosts.pool)} host(s) but {said}; pass --num_nodes N to say "
                                       "how many run")


def _node_rank(request: JobRequest, detection: Detection | None, num_nodes: int) -> int:
    rank = request.remote.node_rank
    if rank is None and detection is not None and detection.node_rank is not None:
        rank = detection.node_rank
        if rank >= num_nodes and request.selection.include is None and request.selection.exclude is None:
            raise UsageError("--node_rank", f"{rank} (from {detection.source}) is outside 0..{num_nodes - 1} for a "
                                            f"{num_nodes}-node world; pass --node_rank K")
    if rank is not None:
        return rank
    if detection is not None:
        raise UsageError("--node_rank", f"{detection.platform.title} ({detection.source}) gives no node rank; "
                                        "pass --node_rank K")
    flag = "--no_ssh" if request.remote.no_ssh else "--pod"
    raise UsageError(flag, "needs --node_rank K (this node's index in the hostfile's order)")


def _announcement(request: JobRequest, detection: Detection | None) -> str | None:
    if detection is None:
        return None
    given = (
        ("--node_rank", request.remote.node_rank is not None and detection.node_rank is not None),
        ("--num_nodes", request.selection.num_nodes is not None and detection.num_nodes is not None),
        ("--master_addr", request.master_addr is not None and detection.master_addr is not None),
        ("--master_port", "--master_port" in request.pod.explicit and detection.master_port is not None),
        ("-H", request.hostfile is not None and bool(detection.hosts)),
        ("--hosts", request.pod.hosts is not None and bool(detection.hosts)),
        ("--num_gpus", request.selection.num_gpus is not None and detection.slots_per_node is not None),
    )
    flags = [flag for flag, overrides in given if overrides]
    return detection.announcement + (f"; overridden by {', '.join(flags)}" if flags else "")


# ---------------------------------------------------------------------------------------------------------------
# After planning: what the pod-mode runtime needs.


@dataclass(frozen=True)
class PodSetup:
    """One node's view of a pod-mode job. Node 0 listens on ``control_addr:control_port``; every node sends
    ``digest`` and proves it belongs with ``token`` (or, without one, the run id and digest)."""

    node_rank: int
    num_nodes: int
    world: World
    master_addr: str
    master_port: int
    control_addr: str
    control_port: int
    digest: PlanDigest
    token: str | None = field(default=None, repr=False)


def control_port(request: JobRequest) -> int:
    """``--control_port``, else the master port - 1. One rule: the job's own ports count up from the master port
    (rank 0's store at it; with ``--replica_groups G`` group g's store at + g and the Lighthouse's at + G,
    ``counted_ports``), so node 0's control port is below them, never one of them. Below, not above: NVIDIA's
    in-process restart takes the ports above MASTER_PORT too (its stores at + 1 and + 2 + k per restart in its
    examples, issue 39 §3)."""
    port = request.pod.control_port
    if port is None:
        port = request.master_port - 1
        if request.master_port != 0 and port < 1:
            raise UsageError("--control_port", f"the default, --master_port - 1, is {port}: pass --control_port PORT")
        return port
    if port == request.master_port:
        raise UsageError("--control_port", f"{port} is the master port too; node 0 needs two ports")
    if request.replicas is not None and port in counted_ports(request.replicas.groups, request.master_port):
        group = port - request.master_port
        whose = "the Lighthouse's" if group == request.replicas.groups else f"replica group {group}'s store"
        raise UsageError("--control_port", f"{port} is {whose} port (--master_port {request.master_port} + {group}, "
                         f"--replica_groups); give one outside {request.master_port}-"
                         f"{request.master_port + request.replicas.groups}, or leave it out (--master_port - 1)")
    return port


def pod_setup(plan: Plan, *, token: str | None) -> PodSetup:
    rank = plan.request.remote.node_rank
    if not plan.request.remote.no_ssh or rank is None:
        raise UsageError("--pod", "this plan is not a pod-mode plan (no node rank)")
    if not 0 <= rank < len(plan.nodes):
        count = len(plan.nodes)
        raise UsageError("--node_rank", f"{rank} is outside 0..{count - 1} for a {count}-node world")
    master = plan.rendezvous
    return PodSetup(
        node_rank=rank, num_nodes=len(plan.nodes), world=plan.world, master_addr=master.known_master_addr,
        master_port=master.master_port, control_addr=master.known_master_addr, control_port=control_port(plan.request),
        digest=plan_digest(plan), token=token,
    )


def dry_run_json(plan: Plan) -> dict[str, Any]:
    """The dry run's ``platform`` (what was detected) and ``pod`` (this node's pod-mode setup) keys."""
    detected = plan.request.pod.detected
    pod = None
    if plan.request.remote.no_ssh and plan.request.remote.node_rank is not None:
        # the token is read (and checked) as the real run reads it, never shown
        setup = pod_setup(plan, token=load_token(os.environ, plan.request.pod.token_file))
        pod = {"node_rank": setup.node_rank, "num_nodes": setup.num_nodes, "control_addr": setup.control_addr,
               "control_port": setup.control_port, "digest": setup.digest.sha256,
               "authenticated": setup.token is not None}
    return {"platform": detected.to_json() if detected is not None else None, "pod": pod}


def dry_run_lines(plan: Plan) -> list[str]:
    data = dry_run_json(plan)
    lines = []
    if data["platform"] is not None:
        lines.append(f"platform: {data['platform']['announcement'].removeprefix('xrun: ')}")
    if data["pod"] is not None:
        pod = data["pod"]
        auth = "authenticated by the shared token" if pod["authenticated"] else "unauthenticated (no token)"
        lines.append(f"pod: node {pod['node_rank']} of {pod['num_nodes']}, control {pod['control_addr']}:"
                     f"{pod['control_port']}, plan digest {pod['digest'][:16]}; {auth}")
    return lines

