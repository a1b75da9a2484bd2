"""The job plan: which hosts, which slots, which ranks, with what env and argv. Pure, and printed by --dry-run.

``make_plan`` asks the chosen backend's traits (``xrun.runner.backends.Traits``) what differs between backends:
where the master is known, whether env travels, whether nodes plan alone. The request steps that read the
machine before it (a free port for a local run, the environment to export for a remote one) are the planner's
(``xrun.runner.planner``), which also chooses the hosts and the backend.

Rank 0's port (issue 17): without ``--master_port`` (``PortChoice.FREE``) a local run draws a free port in the
planner, and a channel run lets node 0's agent keep the default when it is free there or take a free one, told to
every node at the start barrier (``Plan.node0_picks_port``); only ``--elastic`` on several nodes keeps the fixed
default, because its nodes meet at the endpoint without a barrier.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from xrun.common.command import AgentCommand
from xrun.common.rankplan import LaunchOptions, Rendezvous, World, encode_world_info, node_ranks, world_shape
from xrun.common.rdzv import resolve_elastic
from xrun.common.spec import AgentOptions, ElasticOptions, LocalEcho, NodeSpec, check_rank_list
from xrun.errors import UsageError
from xrun.runner.backends import backend_traits
from xrun.runner.hosts.selection import Selection
from xrun.runner.hosts.this_machine import LOCAL_ADDR
from xrun.runner.metrics_options import MetricsOptions
from xrun.runner.pod.options import PodRequest
from xrun.runner.remote_options import RemoteOptions
from xrun.runner.replica_options import FLAG as REPLICA_FLAG
from xrun.runner.replica_options import ReplicaRequest, check_ports_known, replica_groups
from xrun.runner.restart_options import RestartPolicy
from xrun.runner.torchrun import Torchrun
from xrun.strict_numbers import MAX_RANKS


class PortChoice(Enum):
    """Where rank 0's port comes from."""

    GIVEN = "given"  # --master_port N, or a platform's: used as is; taken on node 0 -> exit 2 before any rank starts
    FREE = "free"  # no --master_port (or 0): a free port, chosen by this run (the default kept where free)


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for, typed; built from the command line, consumed by the planner."""

    script: str
    args: tuple[str, ...] = ()
    hostfile: str | None = None
    selection: Selection = field(default_factory=Selection)
    master_addr: str | None = None
    master_port: int = 29500
    master_port_choice: PortChoice = PortChoice.GIVEN
    launcher: str | None = None
    launch: LaunchOptions = field(default_factory=LaunchOptions)
    options: AgentOptions = field(default_factory=AgentOptions)
    run_id: str = "xrun"
    remote: RemoteOptions = field(default_factory=RemoteOptions)
    env: Mapping[str, str] = field(default_factory=dict)  # exported to remote nodes (xrun.runner.envpass)
    cwd: str | None = None  # remote agents chdir here
    elastic: ElasticOptions | None = None  # --elastic: torch's elastic agent on every node
    pod: PodRequest = field(default_factory=PodRequest)  # --pod, --platform, --hosts, ... (xrun.runner.pod.placement)
    restart: RestartPolicy = field(default_factory=RestartPolicy)  # --max_restarts of a static job (issue 23)
    torchrun: Torchrun = field(default_factory=Torchrun)  # what a torchrun line asks of the world (issue 41)
    replicas: ReplicaRequest | None = None  # --replica_groups: torchft's replica groups (issue 39 §2)
    metrics: MetricsOptions | None = None  # --metrics_port: the head serves its figures to Prometheus (issue 40)


@dataclass(frozen=True)
class Plan:
    request: JobRequest
    world: World
    rendezvous: Rendezvous
    backend: str
    nodes: tuple[NodeSpec, ...]
    spares: tuple[str, ...] = ()  # --spares: hot spares' hosts, outside the world (issue 23)

    @property
    def agent_hosts(self) -> tuple[str, ...]:
        """Every agent's host by agent id: the world's nodes in node-rank order, then the hot spares."""
        return (*(node.host for node in self.nodes), *self.spares)

    @property
    def world_info(self) -> str:
        return encode_world_info(self.world)

    @property
    def world_size(self) -> int:
        return sum(len(slots) for slots in self.world.values())

    @property
    def ranks_run(self) -> int:
        """How many ranks this job runs: the world's, but for a stand-alone agent's node of a larger world
        (``standalone_plan``) that node's own (its ranks keep the world's numbers and ``WORLD_SIZE``)."""
        return sum(len(node.ranks) for node in self.nodes)

    @property
    def heard_world_size(self) -> int | None:
        """The world's size where this job runs every rank of it, as the head's views count the default group (the
        ranks 0..N-1, one that sends no record named); None for a stand-alone agent's node of a larger world: its
        head hears only this node's ranks, and knows the others by no record."""
        return self.world_size if self.ranks_run == self.world_size else None

    @property
    def shown_master_addr(self) -> str:
        """MASTER_ADDR as ``--dry-run`` shows it: ``<node0 address>`` where the start barrier decides it."""
        return self.rendezvous.master_addr or f"<{next(iter(self.world))} address>"

    @property
    def node0_picks_port(self) -> bool:
        """Node 0's agent chooses rank 0's port at the start barrier (the plan's port is only its first try).

        Not for a local run (its free port is drawn into the plan), for ``--elastic`` (no barrier to tell it) nor for
        ``--replica_groups`` (each group's port counts up from the plan's, on the group's own node).
        """
        if self.rendezvous.master_port == 0:
            return True
        local = backend_traits(self.backend).local
        elastic = bool(self.nodes) and self.nodes[0].elastic is not None
        replicas = bool(self.nodes) and self.nodes[0].replicas is not None  # its ports count up from the plan's
        return self.request.master_port_choice is PortChoice.FREE and not (local or elastic or replicas)

    @property
    def job_restart(self) -> RestartPolicy:
        """``--max_restarts`` of the job as a whole; under ``--replica_groups`` it is each group's budget, spent by
        the group's node (``xrun.launch.replicas.supervision``), and the job itself is never restarted."""
        replicas = bool(self.nodes) and self.nodes[0].replicas is not None
        return replace(self.request.restart, max_restarts=0) if replicas else self.request.restart

    def agent_command(self, node: NodeSpec) -> AgentCommand:
        """The stand-alone agent command line equivalent to running ``node`` in-process."""
        return AgentCommand(
            world=self.world,
            node_rank=node.node_rank,
            rendezvous=self.rendezvous,
            launch=self.request.launch,
            options=self.request.options,
            script=self.request.script,
            args=self.request.args,
            elastic=node.elastic,  # resolved: the command line carries the counts, endpoint and id it ran with
            max_restarts=self.job_restart.max_restarts if node.elastic is None else 0,  # the job's, as its head runs it
        )


def standalone_plan(command: AgentCommand) -> Plan:
    """The one-node job a stand-alone agent's command line asks for (``python -m xrun.launch --world_info=...``,
    DeepSpeed's per-node form: xrun.joined.standalone), the inverse of ``Plan.agent_command``: its node alone, with
    the ranks the command line gives it (numbered in its whole world, told that world's WORLD_SIZE) and rank 0's
    address and port as given: no port is picked, since the other nodes' agents were told the same. Its
    ``--max_restarts`` (without ``--elastic``) restarts this node's ranks through the head's ``Job``, each attempt
    at the same port."""
    rdzv = command.rendezvous
    request = JobRequest(script=command.script, args=command.args, master_addr=rdzv.master_addr,
                         master_port=rdzv.master_port, master_port_choice=PortChoice.GIVEN, launch=command.launch,
                         options=command.options, run_id=rdzv.run_id, elastic=command.elastic,
                         restart=RestartPolicy(max_restarts=command.max_restarts))
    return Plan(request=request, world=command.world, rendezvous=rdzv, backend="local", nodes=(command.node_spec(),))


def split_spares(world: Mapping[str, tuple[int, ...]], spares: int, backend: str) -> tuple[World, tuple[str, ...]]:
    """--spares N (issue 23): the last N selected hosts stand by outside the world; what is left is the world."""
    world = dict(world)
    if not spares:
        return world, ()
    traits = backend_traits(backend)
    if traits.local:
        raise UsageError("--spares", "a local run is one node: there is no node to lose and no host to stand by")
    if traits.nodes_start_themselves:
        raise UsageError("--spares", "does not apply in pod mode (--pod, --no_ssh, a pod platform): every node starts "
                         "its own xrun, so none stands by outside the world; with --max_restarts a lost node other "
                         "than node 0 comes back instead (its pod re-created with the same index)")
    if not traits.spares:
        raise UsageError("--spares", f"the {backend} backend cannot start an agent on a spare when a node is lost; "
                         "use --launcher ssh or --launcher pdsh")
    hosts = list(world)
    if spares >= len(hosts):
        what = "more spares than" if spares > len(hosts) else "no world left of"
        raise UsageError("--spares", f"{spares} leaves {what} the {len(hosts)} selected host(s); at least one must "
                         "run the job")
    kept = hosts[: len(hosts) - spares]
    return {host: world[host] for host in kept}, tuple(hosts[len(kept):])


def with_torchrun_world(request: JobRequest, world: World) -> JobRequest:
    """A torchrun line's ``--nnodes N`` checked against the world, and the local ranks its console shows at all
    (``--local-ranks-filter``, ``--redirects 3``) as the global ranks ``--console_ranks`` names, which the head and
    each node count (a line said by every rank shown goes out at once)."""
    wanted = request.torchrun.nnodes
    if wanted is not None and wanted != len(world):
        raise UsageError("--nnodes", f"{wanted}, but this job has {len(world)} node(s); xrun starts every node from "
                         "one command: name the hosts (-H, --hosts) or, started on every node, --pod --node_rank K "
                         "--hosts ... (docs/migrating-from-torchrun.md)")
    echo = request.options.local_echo  # every node applies it to its streams; the head counts the ranks shown
    if echo == LocalEcho():
        return request
    given = request.options.console_ranks
    ranks, first = [], 0
    for slots in world.values():
        ranks += [first + local for local in range(len(slots)) if echo.shows(local)]
        first += len(slots)
    shown = tuple(r for r in ranks if given is None or r in given)
    return replace(request, options=replace(request.options, console_ranks=shown))


def make_plan(request: JobRequest, world: Mapping[str, tuple[int, ...]], backend: str) -> Plan:
    """Pure: the world and the request fix every rank's env and argv (the last ``--spares`` hosts stand by)."""
    world, spares = split_spares(world, request.restart.spares, backend)
    request = with_torchrun_world(request, world)
    size = sum(len(slots) for slots in world.values())
    if size > MAX_RANKS:  # a platform's or allocation's world, each within its per-node limits
        raise UsageError("world", f"{size} ranks; xrun accepts at most {MAX_RANKS} per job")
    traits = backend_traits(backend)
    first = next(iter(world))
    # Channel backends learn node 0's reachable address at the start barrier (None here: decided there, once).
    # Elastic nodes start without a barrier, so the rendezvous endpoint must be known up front: the first host.
    auto = None if traits.uses_channel and request.elastic is None else first
    master_addr = request.master_addr or (LOCAL_ADDR if traits.local else auto)
    rdzv = Rendezvous(master_addr=master_addr, master_port=request.master_port, run_id=request.run_id)
    elastic = request.elastic
    if elastic is not None and traits.nodes_start_themselves and elastic.rdzv_id is None:
        # Each node's xrun would draw its own random run id: the rendezvous needs one they all compute alike.
        elastic = replace(elastic, rdzv_id=f"xrun-{rdzv.known_master_addr}-{rdzv.master_port}")
    elastic = resolve_elastic(elastic, world, rdzv)
    if elastic is None:  # an elastic world's size is only known at each rendezvous
        check_rank_list("--console_ranks", request.options.console_ranks, sum(len(s) for s in world.values()))
    if elastic is not None and rdzv.master_port == 0:
        raise UsageError("--master_port", "0 cannot work with --elastic on several nodes: each needs the port up front")
    replicas = None
    if request.replicas is not None:
        if request.pod.numbered and len(world) > 1:  # pod mode: a node's groups meet at its name (group_env)
            raise UsageError(REPLICA_FLAG, "needs every node's name in pod mode (a node's groups meet at it), but "
                             "the nodes are only counted: name them with -H HOSTFILE or --hosts PATTERN")
        replicas = replica_groups(request.replicas, world_size=size, master_port=rdzv.master_port)
        if not traits.local:
            check_ports_known(rdzv.master_port)
    shape = world_shape(world)
    exports = dict(request.env)  # a local run: only its --export (planner.with_local_exports); one for every node
    nodes = tuple(
        NodeSpec(
            host=host,
            node_rank=node_rank,
            ranks=node_ranks(world, node_rank, rdzv, request.launch, request.script, request.args, shape=shape,
                             max_restarts=request.restart.max_restarts, replicas=replicas),
            options=request.options,
            env=exports,  # read-only (a Mapping): shared, not copied per node
            cwd=None if traits.local else request.cwd,
            run_id=request.run_id,
            elastic=elastic,
            replicas=replicas,
        )
        for node_rank, host in enumerate(world)
    )
    return Plan(request=request, world=world, rendezvous=rdzv, backend=backend, nodes=nodes, spares=spares)

