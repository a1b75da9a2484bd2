"""The store an attempt's ranks meet in, hosted by the agent of the node that runs rank 0 (issue 39 §1).

torchrun's contract: its agent hosts a TCPStore at ``MASTER_ADDR:MASTER_PORT`` and tells every rank
``TORCHELASTIC_USE_AGENT_STORE=True``, so every rank, rank 0 included, opens the store as a client
(torch/distributed/rendezvous.py, ``_create_c10d_store``). xrun's static path keeps it with a new, empty store for
each attempt: up before this node starts a rank, closed when the attempt's ranks are gone, so a restarted group
reads nothing of the attempt before (torch 2.13 puts no attempt prefix on the keys, and torchft's carry none).
Under ``--elastic`` torch's own agent decides (xrun.launch.elastic.run).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager

from xrun.common.spec import NodeSpec
from xrun.errors import PortBusyError
from xrun.launch.store.server import StoreServer
from xrun.net import port_holder

USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


def store_endpoint(spec: NodeSpec) -> tuple[str, int] | None:
    """Where this node hosts the store: at rank 0's ``MASTER_PORT`` where this node runs rank 0 and the ranks are
    told to use the agent's store (None elsewhere); on ``MASTER_ADDR`` alone when it is a loopback address (every
    rank runs on this machine, as in a local run: nobody else need reach a store without authentication), else on
    every address, as torch's own store listens (a master name may resolve to another of this node's addresses
    here than on the other nodes)."""
    if spec.elastic is not None:
        return None
    for rank in spec.ranks:
        if rank.rank == 0 and rank.env.get(USE_AGENT_STORE) == "True" and rank.env.get("MASTER_PORT"):
            return (_loopback_or_every(rank.env.get("MASTER_ADDR", "")), int(rank.env["MASTER_PORT"]))
    return None


def _loopback_or_every(master: str) -> str:
    try:
        return master if ipaddress.ip_address(master).is_loopback else ""
    except ValueError:  # a name: it may resolve differently on each node
        return ""


@contextmanager
def agent_store(spec: NodeSpec) -> Iterator[StoreServer | None]:
    """The attempt's store, listening where ``store_endpoint`` says, for the ``with`` block; None on a node that
    hosts none. A port taken meanwhile is ``PortBusyError``."""
    endpoint = store_endpoint(spec)
    if endpoint is None:
        yield None
        return
    host, port = endpoint
    try:
        server = StoreServer(host, port)
    except OSError as err:
        raise PortBusyError(spec.host, port, port_holder(port)) from err
    with server.start():
        yield server
