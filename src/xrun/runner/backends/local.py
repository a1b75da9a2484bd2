"""The local backend: this machine is the only node, so the runner runs the node agent in its own process."""

from __future__ import annotations

import os
import time

from xrun.common.command import agent_argv
from xrun.common.ranks.cpusets import gpu_nodes, plan_bindings
from xrun.common.spec import NodeSpec
from xrun.launch.agent import preloaded, run_node_result
from xrun.launch.replicas.lighthouse import lighthouse
from xrun.runner.backends import Invocation, NodeCommand, Traits
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

    def execute(self, plan: Plan) -> int:
        # The job-level part (xrun.runner.backends.local_job: the head's restart rules, verdict and summary) loads
        # before the ranks start only with restarts: it is 31 modules, ~2 MiB of RSS that each rank's process
        # would inherit at fork (tests/test_summary.py measures it).
        # --preload: one helper for every attempt; --replica_groups: torchft's Lighthouse, up before any rank
        with preloaded(plan.nodes[0]) as helper, lighthouse(plan.nodes[0]):
            if plan.request.restart.restarts:  # --max_restarts: a loop of attempts around the in-process agent
                from xrun.runner.backends.local_job import run_attempts  # lazy: see above

                return run_attempts(plan, preload=helper)
            began = time.monotonic()
            code, result = run_node_result(plan.nodes[0], preload=helper)
            if plan.request.options.log_dir is None:
                return code
            from xrun.runner.backends.local_job import run_once  # lazy: the ranks are gone

            return run_once(plan, code, result, began)  # the job's summary.json
