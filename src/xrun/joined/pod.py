"""Pod mode's runtime on each node: what each node's xrun does when every node starts xrun itself (issue 11): node
0's head and every node's own agent, joined in its one process.

    the SignalLatch (from here on a shutdown signal is recorded, never its default action) -> token
    (XRUN_TOKEN / --token_file, then gone from the ranks' environment) -> PodSetup
    node 0: the control server on a background thread (xrun.runner.pod.node0_server), handed every signal node 0 gets:
    node 0 is the job's head, so its signal stops the job on every node
    every node, node 0 included over loopback: ``pod_node`` -> the node layer's agent
    (``xrun.launch.session.driver.run_pod_node``: join, ready, barrier, attempts, verdict) -> its exit code

Every rule of the job is the job state machine's, on node 0 (``xrun.runner.job.machine``): the barrier, the join
timeout, the first failure stopping every node, keepalives, a refused digest (exit 2), restarts and nodes that
come back (its pod-mode rules). This node's own half (the agent's machine, ``xrun.launch.session``) never
runs anything the channel sends (there is no spec in pod mode): it runs this node's own spec, built here, and ends
with the verdict's exit code. Node 0 prints the job's failure report (its server does); the other nodes one line
naming the root cause, which node 0 sends with the verdict.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import replace

from xrun.channel import ChannelError
from xrun.common.output.status import say
from xrun.common.procs.signals import SHUTDOWN_SIGNALS, SignalLatch
from xrun.common.result.outcome import NODE_FAILURE_EXIT
from xrun.common.spec import NodeSpec
from xrun.launch.session.driver import run_pod_node
from xrun.launch.session.events import PortRule
from xrun.launch.session.pod import Node0, PodNode
from xrun.runner.job.machine import LINGER
from xrun.runner.job.relay import merges_nodes
from xrun.runner.job.stop import STOP_GRACE
from xrun.runner.plan import Plan
from xrun.runner.pod.node0_server import ServerThread
from xrun.runner.pod.placement import PodSetup, pod_setup
from xrun.runner.pod.secret import TOKEN_ENV, auth_notice, load_token, pod_key


def run_pod(plan: Plan) -> int:
    """This node's share of a pod-mode job, to the job's exit code."""
    with SignalLatch().installed(SHUTDOWN_SIGNALS) as latch:  # from here on no signal takes its default action
        token = load_token(os.environ, plan.request.pod.token_file)
        os.environ.pop(TOKEN_ENV, None)  # the secret stays with xrun: no rank inherits it
        setup = pod_setup(plan, token=token)
        notice = auth_notice(token)
        if notice:
            print(notice, file=sys.stderr)
        server = None
        try:
            node0 = Node0(setup.control_addr, setup.control_port, plan.nodes[0].host)
            if setup.node_rank == 0:
                server = ServerThread(plan, setup, join_timeout=plan.request.remote.join_timeout)
                server.start()
                latch.listen(server.server.post_signal)  # node 0 is the job's head: its signal stops the job
                node0 = replace(node0, addr=server.bind.connect)
            return run_pod_node(pod_node(plan, setup, node0), latch)
        except ChannelError as err:  # node 0 cannot host the control channel
            say(err.reason)
            return NODE_FAILURE_EXIT
        finally:
            if server is not None:
                server.join(LINGER + 2.0)  # its report is printed before this xrun exits


def pod_node(plan: Plan, setup: PodSetup, node0: Node0) -> PodNode:
    """This node's part as the node layer's agent needs it."""
    spec = own_name(plan, plan.nodes[setup.node_rank])
    static_node0 = setup.node_rank == 0 and plan.nodes[0].elastic is None
    return PodNode(
        node_rank=setup.node_rank, num_nodes=setup.num_nodes, world_size=plan.world_size, spec=spec,
        master_addr=plan.rendezvous.known_master_addr, master_port=plan.rendezvous.master_port,
        ready_port=PortRule(plan.node0_picks_port, setup.master_port) if static_node0 else None,
        restarts=plan.job_restart.restarts,
        verdict_wait=plan.request.options.shutdown_timeout + STOP_GRACE + LINGER + 5.0,
        forward_console=merges_nodes(plan), node0=node0, join_timeout=plan.request.remote.join_timeout,
        digest=setup.digest.to_json(), key=pod_key(setup.token, run_id=plan.request.run_id),
    )


def own_name(plan: Plan, spec: NodeSpec) -> NodeSpec:
    """This node's spec under the host name it reports in its hello, where the plan could only number the nodes:
    its lines' prefixes, log folder and reports then name the pod a user finds in ``kubectl`` (issue 25 §6)."""
    return replace(spec, host=socket.gethostname()) if plan.request.pod.numbered else spec
