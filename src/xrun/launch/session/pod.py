"""Pod mode's node, as the node layer is handed it: every node starts xrun itself, and node 0's
xrun hosts the job's control server (``xrun.joined.pod`` takes the head's plan, starts node 0's server and builds
this; ``xrun.launch.session.driver.run_pod_node`` runs the node's part). Plain data: no rule of the job's is
here (those are node 0's machine's, ``xrun.runner.job.machine``), only what this node needs to follow them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xrun.common.spec import NodeSpec
from xrun.launch.session.events import PortRule


@dataclass(frozen=True)
class Node0:
    """Where this node reaches node 0's control server (node 0 itself: over loopback)."""

    addr: str
    port: int
    host: str  # node 0's name in the plan, for messages


@dataclass(frozen=True)
class PodNode:
    """This node's part of a pod-mode job."""

    node_rank: int
    num_nodes: int
    world_size: int  # every node's ranks together, for the started line
    spec: NodeSpec  # this node's own spec, under the host name it reports (issue 25 §6); nothing is sent one
    master_addr: str  # the plan's rendezvous; node 0's start may give another port (its pick)
    master_port: int
    ready_port: PortRule | None  # node 0 of a static job: how rank 0's port is settled before its first ready
    restarts: bool  # --max_restarts: a node that leaves comes back; node 0 restarts the job
    verdict_wait: float  # once this node failed: how long node 0's verdict may take (its stop's whole deadline)
    forward_console: bool  # --dedupe across nodes: this node's console goes to node 0's too
    node0: Node0
    join_timeout: float
    digest: Mapping[str, Any]  # the plan's digest, said in the hello: a node started with other arguments is refused
    key: bytes = field(repr=False)  # the channel key derived from the job's secret
