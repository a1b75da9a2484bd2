"""A head-mode control server for tests, as ``run_over_channel`` makes one: TLS, the run token as every
node's key (the ssh backend's way), and the endpoint the agents get."""

from xrun.common.output.render import JobConsole
from xrun.runner.backends.channel import Endpoint
from xrun.runner.job.control_server import ControlServer
from xrun.runner.job.gate import Gate
from xrun.runner.job.keys import NodeKeys
from xrun.runner.job.relay import merges_nodes, ranks_shown

TOKEN = "t0ken"


def head_server(plan, *, token=TOKEN, **kwargs):
    gate = Gate(NodeKeys.shared_secret(len(plan.nodes), token), nodes=len(plan.nodes), prove_server=False)
    return ControlServer(plan, gate, **kwargs)


def endpoint_of(server, port, addr="127.0.0.1", *, token=TOKEN):
    return Endpoint(addr, port, token, server.gate.fingerprint)


def console_of(server):
    """The job's console as ``server`` renders it (every node's lines, merged as the plan says), kept in a list of
    writes instead of written: the agents' ranks' lines come over the channel, not on their own stdout."""
    shown = []
    server.console = JobConsole(lambda fd, data: shown.append(data), merge=merges_nodes(server.plan),
                                expected=ranks_shown(server.plan))
    return shown
