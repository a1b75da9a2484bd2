"""What the job state machine (``xrun.runner.job.machine``) is told about a run: its nodes, its deadlines, its
rendezvous endpoint, whether it is elastic (issue 6) or pod mode (the verdict goes to every node), and how it
restarts, on which hot spares (issue 23)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xrun.common.spec import OnRankExit
from xrun.runner.replicas.moves import GroupLayout
from xrun.runner.restart_options import RestartPolicy

if TYPE_CHECKING:
    from xrun.runner.plan import Plan


@dataclass(frozen=True)
class ElasticRule:
    """--elastic: no barrier; the endpoint is the plan's (every node must know it before node 0 is up)."""

    min_nodes: int
    master_addr: str


@dataclass(frozen=True)
class JobConfig:
    hosts: tuple[str, ...]  # by node rank
    join_timeout: float
    shutdown_timeout: float  # the agents' own deadline to stop their ranks, sent with every stop
    world_size: int
    master_addr: str | None = None  # --master_addr; None: node 0's address as its agent saw it
    master_port: int = 0  # 0: node 0's agent picks a free one before the barrier
    pick_master_port: bool = False  # master_port is node 0's first try; its agent reports the port it will use
    elastic: ElasticRule | None = None
    verdict_to_nodes: bool = False  # pod mode: every node exits with the job's code, so it must be told
    restart: RestartPolicy = field(default_factory=RestartPolicy)  # --max_restarts of a static job (issue 23)
    numbered: bool = False  # pod mode without host names: a node goes by the host name its hello reports
    precheck: bool = False  # --precheck (issue 24): the network check across the nodes before any rank starts
    spares: tuple[str, ...] = ()  # --spares: the hot spares' hosts, whose agent ids follow the world's
    keep_survivors: bool = False  # --on_rank_exit keep: a rank's failure stops no other (issue 39 §3)
    groups: GroupLayout | None = None  # --replica_groups: where they lie, each one's budget (a lost node's move)

    @property
    def spare_role(self) -> str:
        """What a hot spare is there for: a lost node's place at a restart (``--max_restarts``), a lost node's replica
        groups (``--replica_groups``, whose budget is each group's), or, without either (``--precheck`` alone,
        issue 33), only the place of a node ``--precheck`` finds bad."""
        if self.groups is not None and self.groups.budget:
            return "a lost node's replica groups, which start again on it"
        if self.restart.restarts:
            return "a lost node's place at a restart"
        return "the place of a node --precheck finds bad before the start"

    @property
    def rejoins(self) -> bool:
        """Pod mode with --max_restarts: a node other than node 0 may come back to the job (its pod re-created)."""
        return self.verdict_to_nodes and self.restart.restarts

    @classmethod
    def from_plan(cls, plan: Plan, *, join_timeout: float) -> JobConfig:
        elastic = plan.nodes[0].elastic if plan.nodes else None
        return cls(
            hosts=tuple(f"node {node.node_rank}" if plan.request.pod.numbered else node.host for node in plan.nodes),
            join_timeout=join_timeout,
            shutdown_timeout=plan.request.options.shutdown_timeout,
            world_size=plan.ranks_run,  # a stand-alone agent's node of a larger world: its own ranks
            master_addr=plan.request.master_addr,
            master_port=plan.rendezvous.master_port,
            pick_master_port=plan.node0_picks_port,
            elastic=None if elastic is None else ElasticRule(elastic.min_nodes or 1, plan.rendezvous.known_master_addr),
            restart=plan.job_restart,
            numbered=plan.request.pod.numbered,
            precheck=plan.request.remote.precheck,
            spares=plan.spares,
            keep_survivors=plan.request.options.on_rank_exit is OnRankExit.KEEP,
            groups=GroupLayout.of([[(r.rank, r.env) for r in node.ranks] for node in plan.nodes],
                                  plan.request.restart.max_restarts) if plan.nodes and plan.nodes[0].replicas else None,
        )
