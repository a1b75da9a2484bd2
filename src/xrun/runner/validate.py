"""``validate(plan)``: what the run would refuse on this machine, checked before ``--dry-run`` prints and before a
real run executes (one function for both, so a dry run that passes means the run starts; issue 12).

On this machine: the node of a local run gets the node preflight (``xrun.common.preflight``: interpreter, program,
log files, binding; ``--preload``'s modules found by the ranks' interpreter); a ``--no_ssh``/pod node's program, log
directory and preloaded modules are checked by its dry run, while its real run checks all of it once it joined node
0 (a finding then ends the job on every node, not on this one while the others wait for it); a ``--control_addr``
must be an address the control server can listen on, a local run's explicit ``--master_port`` must be free (issue
17), ``--precheck`` needs a static job of several nodes with a head, and the job's open files must fit under this
machine's hard limit (``xrun.fdlimit``: a control channel per node, or the ranks that run here). What only a remote
node can tell (its script, its interpreter, whether ``--rdzv_endpoint``'s host resolves there) is checked by its agent
there and reported as one line naming the host.
"""

from __future__ import annotations

import os
import socket

from xrun.common.preflight import check_endpoint, check_node, check_ranks
from xrun.common.preload.argv import parse_python_argv, path0
from xrun.common.preload.find import check_findable
from xrun.errors import UsageError
from xrun.fdlimit import FDS_PER_CHANNEL_NODE, agent_open_files, check_open_files
from xrun.net import master_port
from xrun.printable import shown
from xrun.runner.backends import Traits, backend_traits
from xrun.runner.metrics_options import check_listen
from xrun.runner.plan import Plan, PortChoice


def validate(plan: Plan, *, dry_run: bool = False) -> None:
    traits = backend_traits(plan.backend)
    request = plan.request
    if traits.local or (traits.nodes_start_themselves and dry_run):  # a pod's real run: once it joined node 0
        check_node(request.launch.python, request.launch.mode, request.script, request.options.log_dir)
        if request.options.preload:  # found without importing; the run's helper then imports them (issue 32)
            command = parse_python_argv(plan.nodes[0].ranks[0].argv)
            check_findable(command.python, request.options.preload, path0(command, request.cwd or os.getcwd()))
    if traits.local:
        check_ranks(plan.nodes[0])  # --elastic's endpoint too: this machine is the node that looks it up
    elif traits.nodes_start_themselves and dry_run and plan.nodes[0].elastic is not None:
        endpoint = plan.nodes[0].elastic.rdzv_endpoint  # the same on every node; a real run checks it once joined
        if endpoint:
            check_endpoint("this node", endpoint)
    if traits.local and request.master_port_choice is PortChoice.GIVEN:
        # An explicit --master_port taken here: one line naming its holder, not rank 0's EADDRINUSE traceback.
        master_port(plan.nodes[0].host, plan.rendezvous.master_port, pick=False)
    if traits.uses_channel and request.remote.control_addr is not None:
        check_listen_address(request.remote.control_addr)
    if request.remote.precheck:
        check_precheck(plan, traits)
    if request.metrics is not None and not traits.nodes_start_themselves:  # pod mode: node 0 serves, maybe not here
        check_listen(request.metrics)
    check_open_files("this job's head node", head_open_files(plan, traits))


def check_precheck(plan: Plan, traits: Traits) -> None:
    """--precheck (issue 24) pairs the nodes of a static job over the head's control channel."""
    if len(plan.nodes) < 2:
        hosts = ", ".join(node.host for node in plan.nodes)
        raise UsageError("--precheck", f"needs at least 2 nodes to pair, the job has {len(plan.nodes)} ({hosts})")
    if not traits.uses_channel:
        raise UsageError("--precheck", "is not supported in pod mode (--pod, --no_ssh) yet; run xrun check --network "
                         "-H HOSTFILE before the job instead")
    if plan.nodes[0].elastic is not None:
        raise UsageError("--precheck", "does not go with --elastic: its nodes start as they come, never all at once; "
                         "run xrun check --network -H HOSTFILE before the job instead")


def head_open_files(plan: Plan, traits: Traits) -> int:
    """The fds this machine's xrun holds at most: its own node's ranks (run here, or by node 0 of a pod) and a
    control channel per node (the server of a channel backend, or node 0's in pod mode)."""
    ranks_here = max((len(node.ranks) for node in plan.nodes), default=0)
    if not (traits.local or traits.nodes_start_themselves):
        ranks_here = 0  # the agents run elsewhere (or under an engine's process, with its own limit)
    channels = traits.uses_channel or (traits.nodes_start_themselves and len(plan.nodes) > 1)
    per_node = FDS_PER_CHANNEL_NODE + traits.extra_fds_per_node if channels else 0
    return agent_open_files(ranks_here) + per_node * len(plan.agent_hosts)  # the hot spares hold channels too


def check_listen_address(addr: str) -> None:
    """``--control_addr`` names an address of this machine (the control server binds it; agents connect to it)."""
    try:
        infos = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise UsageError("--control_addr", f"cannot resolve {shown(addr)}: {err}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.bind(sockaddr)
        except OSError as err:
            raise UsageError("--control_addr", f"{shown(addr)} is not an address of this machine: "
                             f"{err.strerror or err}") from None
