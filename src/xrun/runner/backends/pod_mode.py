"""Pod mode's backend (``--pod``, ``--no_ssh --node_rank K``, a detected platform): every node starts xrun itself.

There is no fan-out: each xrun runs its own node's agent in-process, with the same env contract as the remote
backends (``--export`` and ``.xrun_env`` apply, ``PYTHONPATH`` gets the working directory), and joins the
job's control channel, which node 0's xrun hosts (``xrun.joined.pod``): the same start barrier, teardown,
keepalives and exit code as the head-node backends, and a plan digest so that a node started with another
command line is refused by name. Every node must be given the same hostfile (or platform), selection and
``--master_port``; ``MASTER_ADDR`` is ``--master_addr``, the platform's, or else the first host's name as
written in the hostfile (it must resolve to node 0 on every node, e.g. a headless Service's DNS name).
``--master_port 0`` is refused: nodes that cannot talk to each other cannot agree on a random port.
"""

from __future__ import annotations

from xrun.common.command import agent_argv
from xrun.errors import UsageError
from xrun.runner.backends import Invocation, NodeCommand, Traits
from xrun.runner.backends.base import InProcess
from xrun.runner.plan import Plan


def this_node(plan: Plan) -> int:
    rank = plan.request.remote.node_rank
    if rank is None:
        raise UsageError("--no_ssh", "needs --node_rank K (this node's index in the hostfile's order)")
    if not 0 <= rank < len(plan.nodes):
        count = len(plan.nodes)
        raise UsageError("--node_rank", f"{rank} is outside 0..{count - 1} for a {count}-node world")
    if plan.rendezvous.master_port == 0:
        raise UsageError("--master_port", "0 (a random port) cannot work with --no_ssh: every node needs the same port")
    return rank


class NoSshBackend:
    name = "no_ssh"
    traits = Traits(nodes_start_themselves=True)

    def render(self, plan: Plan) -> Invocation:
        node = plan.nodes[this_node(plan)]
        command = plan.agent_command(node)
        return Invocation(
            backend=self.name,
            commands=(NodeCommand(host=node.host, argv=agent_argv(command)),),
            note=f"pod mode: only node {node.node_rank} ({node.host}) runs here, inside the xrun process; "
            "start xrun with the matching --node_rank on every other node",
        )

    def execute(self, plan: Plan, in_process: InProcess) -> int:
        this_node(plan)
        return in_process.pod_share(plan)
