"""The local backend: this machine is the only node, so the runner runs the node agent in its own process."""

from __future__ import annotations

from xrun.launch.cli import AgentCommand, agent_argv
from xrun.runner.backends import Invocation, NodeCommand
from xrun.runner.plan import Plan


class LocalBackend:
    name = "local"

    def render(self, plan: Plan) -> Invocation:
        node = plan.nodes[0]
        command = AgentCommand(
            world=plan.world,
            node_rank=node.node_rank,
            rendezvous=plan.rendezvous,
            launch=plan.request.launch,
            options=plan.request.options,
            script=plan.request.script,
            args=plan.request.args,
        )
        # The same agent runs in-process (no extra interpreter start); this argv is its stand-alone equivalent.
        return Invocation(
            backend=self.name,
            commands=(NodeCommand(host=node.host, argv=agent_argv(command)),),
            note="agent runs inside the xrun process",
        )

    def execute(self, plan: Plan, invocation: Invocation) -> int:
        from xrun.launch.agent import run_node

        return run_node(plan.nodes[0])
