"""A head-mode control server for tests, as ``run_over_channel`` makes one: TLS, the run token as every
node's key (the ssh backend's way), and the endpoint the agents get."""

from xrun.runner.backends.channel import Endpoint
from xrun.runner.job.control_server import ControlServer
from xrun.runner.job.gate import Gate
from xrun.runner.job.keys import NodeKeys

TOKEN = "t0ken"


def head_server(plan, *, token=TOKEN, **kwargs):
    gate = Gate(NodeKeys.shared_secret(len(plan.nodes), token), nodes=len(plan.nodes), prove_server=False)
    return ControlServer(plan, gate, **kwargs)


def endpoint_of(server, port, addr="127.0.0.1", *, token=TOKEN):
    return Endpoint(addr, port, token, server.gate.fingerprint)
