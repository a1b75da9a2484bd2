"""The local backend: this machine is the only node, a one-node job whose head and agent both run in xrun's own
process (xrun.joined.one_node, handed in as ``InProcess.one_node_job``)."""

from __future__ import annotations

import os

from xrun.common.command import agent_argv
from xrun.common.ranks.cpusets import gpu_nodes, plan_bindings
from xrun.common.spec import NodeSpec
from xrun.runner.backends import Invocation, NodeCommand, Traits
from xrun.runner.backends.base import InProcess
from xrun.runner.plan import Plan


def local_cpu_sets(node: NodeSpec) -> dict[int, str]:
    """Each rank's CPU set under --bind_cores_to_rank, computed exactly as the agent will (reads /sys only);
    on a GPU node, the NUMA node of the rank's GPU that the set was taken from."""
    bindings = plan_bindings(node, os.environ)
    if bindings is None:
        return {}
    from xrun.common.ranks.binding import format_cpus  # lazy: see xrun.common.ranks.cpusets.plan_bindings

    near = gpu_nodes(node, os.environ) or (None,) * len(bindings)
    return {
        rank.rank: format_cpus(b.cpus) + (f", near its GPU on NUMA node {gpu}" if gpu == b.numa_node is not None
                                          else "")
        for rank, b, gpu in zip(node.ranks, bindings, near)
    }


class LocalBackend:
    name = "local"
    traits = Traits(local=True)

    def render(self, plan: Plan) -> Invocation:
        node = plan.nodes[0]
        command = plan.agent_command(node)
        # The same agent runs in-process (no extra interpreter start); this argv is its stand-alone equivalent.
        return Invocation(
            backend=self.name,
            commands=(NodeCommand(host=node.host, argv=agent_argv(command)),),
            note="agent runs inside the xrun process",
            cpus=local_cpu_sets(node),
        )

    def execute(self, plan: Plan, in_process: InProcess) -> int:
        return in_process.one_node_job(plan)
