"""``--metrics_port PORT`` and ``--metrics_addr ADDR``: where the head serves its figures (docs/metrics.md).

The address defaults to loopback: the figures name hosts and ranks, and whoever reaches the port reads them, so
serving them beyond this machine is the user's choice (``--metrics_addr 0.0.0.0``, or the address Prometheus
reaches).
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import socket
from dataclasses import dataclass

from xrun.argsplit import spellings
from xrun.errors import UsageError
from xrun.hostlist import address_problem
from xrun.strict_numbers import port_arg

DEFAULT_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class MetricsOptions:
    port: int
    addr: str = DEFAULT_ADDR


def add_metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        *spellings("--metrics_port"), type=port_arg, metavar="PORT",
        help="serve the job's figures to Prometheus on this port of the head (pod mode: node 0) while it runs; "
        "docs/metrics.md")
    parser.add_argument(
        *spellings("--metrics_addr"), metavar="ADDR",
        help=f"with --metrics_port: the address it listens on (default {DEFAULT_ADDR}: this machine only)")


def metrics_options(ns: argparse.Namespace) -> MetricsOptions | None:
    if ns.metrics_port is None:
        if ns.metrics_addr is not None:
            raise UsageError("--metrics_addr", "only applies with --metrics_port")
        return None
    if not 1 <= ns.metrics_port <= 65535:
        raise UsageError("--metrics_port", f"{ns.metrics_port} is not a TCP port to listen on (1..65535)")
    addr = DEFAULT_ADDR if ns.metrics_addr is None else ns.metrics_addr
    problem = address_problem(addr)
    if problem:
        raise UsageError("--metrics_addr", problem)
    if importlib.util.find_spec("prometheus_client") is None:  # found, not imported: the run imports it
        raise UsageError("--metrics_port", "needs prometheus_client: pip install 'xrun[metrics]'")
    return MetricsOptions(ns.metrics_port, addr)


def check_listen(options: MetricsOptions) -> None:
    """The address and port can be listened on now (``validate``: a dry run that passes means the run starts, and
    a real run hears it before any node is reached); the server's own bind says the same if it changed since."""
    try:
        infos = socket.getaddrinfo(options.addr, options.port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds
            probe.bind(infos[0][4])
    except OSError as err:
        raise listen_error(options, err) from None


def listen_error(options: MetricsOptions, err: OSError) -> UsageError:
    """The one line for an address or port that cannot be listened on, naming the flag to change."""
    if isinstance(err, socket.gaierror):
        return UsageError("--metrics_addr", f"cannot listen on {options.addr}: {err.strerror}")
    flag = "--metrics_addr" if err.errno == errno.EADDRNOTAVAIL else "--metrics_port"
    return UsageError(flag, f"cannot listen on {options.addr}:{options.port}: {err.strerror or err}")
