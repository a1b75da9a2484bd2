"""The store an attempt's ranks meet in, hosted by the agent of the node that runs rank 0 (issue 39 §1).

torchrun's contract: its agent hosts a TCPStore at ``MASTER_ADDR:MASTER_PORT`` and tells every rank
``TORCHELASTIC_USE_AGENT_STORE=True``, so every rank, rank 0 included, opens the store as a client
(torch/distributed/rendezvous.py, ``_create_c10d_store``). xrun's static path keeps it with a new, empty store for
each attempt: up before this node starts a rank, closed when the attempt's ranks are gone, so a restarted group
reads nothing of the attempt before (torch 2.13 puts no attempt prefix on the keys, and torchft's carry none).
Under ``--elastic`` each rendezvous round decides rank 0's node and its port: ``AttemptStores`` hosts a new store
there for every round (xrun.launch.elastic.run). One store is one ``StoreServer`` on one port: a job of several
groups (replica groups, issue 39 §2) hosts one per group.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from xrun.common.output.streams import notice
from xrun.common.spec import NodeSpec, replica_group
from xrun.errors import PortBusyError, UsageError
from xrun.net import port_holder, port_in_use

if TYPE_CHECKING:
    from xrun.launch.store.server import StoreServer

USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


def store_endpoints(spec: NodeSpec) -> dict[int, tuple[str, int]]:
    """Where this node hosts stores: at rank 0's ``MASTER_PORT`` where this node runs rank 0 and the ranks are told
    to use the agent's store (none elsewhere); under ``--replica_groups`` at each group's whose rank 0 (``RANK``
    0 within the group) runs here. On ``MASTER_ADDR`` alone when it is a loopback address (every rank runs on this
    machine, as in a local run: nobody else need reach a store without authentication), else on every address, as
    torch's own store listens (a master name may resolve to another of this node's addresses here than on the
    other nodes)."""
    if spec.elastic is not None:
        return {}
    return {
        replica_group(rank.env): (listen_address(rank.env.get("MASTER_ADDR", "")), int(rank.env["MASTER_PORT"]))
        for rank in spec.ranks
        if rank.env.get("RANK") == "0" and rank.env.get(USE_AGENT_STORE) == "True" and rank.env.get("MASTER_PORT")
    }


def check_group_ports(spec: NodeSpec) -> None:
    """``--replica_groups``: the ports of the groups' stores this node will host are free, checked at its preflight
    (before it says ready: found at the start, a taken one would fail the job after every node began); a taken one
    is a ``UsageError`` (exit 2) naming the group, the host and the holder."""
    if spec.replicas is None:
        return
    for group, (_, port) in sorted(store_endpoints(spec).items()):
        if port_in_use(port):
            holder = port_holder(port)
            raise UsageError("--replica_groups", f"port {port} (group {group}'s store) is already in use on "
                             f"{spec.host}{f' by {holder}' if holder else ''}; give another --master_port (group g's "
                             "port is it + g)")


def listen_address(master: str) -> str:
    """Where a store for ranks told ``MASTER_ADDR=master`` listens: that address when it is a loopback one, else
    every address (``""``)."""
    try:
        return master if ipaddress.ip_address(master).is_loopback else ""
    except ValueError:  # a name: it may resolve differently on each node
        return ""


class AgentStores:
    """The stores this node hosts, by group: ``renew`` gives a restarted replica group a new, empty one."""

    def __init__(self, node: str, endpoints: Mapping[int, tuple[str, int]]) -> None:
        self.node = node
        self._endpoints = dict(endpoints)
        self.servers: dict[int, StoreServer] = {}

    def open(self) -> None:
        for group, endpoint in self._endpoints.items():
            self.servers[group] = hosted(self.node, *endpoint)

    def renew(self, group: int) -> None:
        """Close ``group``'s store (if this node hosts it and it is open) and host a new, empty one at the same
        address."""
        self.close_group(group)
        if group in self._endpoints:
            self.servers[group] = hosted(self.node, *self._endpoints[group])

    def close_group(self, group: int) -> None:
        """A group across nodes whose ranks here are gone: its store closes now, before the other nodes' ranks of it
        may start again, so that one of them that starts first waits in its client's connect retry for the new
        store (``renew``) and never reads the old one."""
        server = self.servers.pop(group, None)
        if server is not None:
            close(self.node, server)

    def close(self) -> None:
        for server in self.servers.values():
            close(self.node, server)
        self.servers.clear()


@contextmanager
def agent_stores(spec: NodeSpec) -> Iterator[AgentStores]:
    """The attempt's stores, listening where ``store_endpoints`` says, for the ``with`` block (none on a node that
    hosts none). A port taken meanwhile is ``PortBusyError``."""
    stores = AgentStores(spec.host, store_endpoints(spec))
    try:
        stores.open()
        yield stores
    finally:
        stores.close()


def hosted(node: str, address: str, port: int) -> StoreServer:
    """A new, empty store listening at ``address:port``, started; a port taken is ``PortBusyError`` on ``node``."""
    # lazy: only rank 0's node hosts a store; the server (~5 ms of imports, python -X importtime) is not loaded by
    # the other agents of a fan-out, which all decide through store_endpoints that they host none (issue 38)
    from xrun.launch.store.server import StoreServer

    try:
        server = StoreServer(address, port)
    except OSError as err:
        raise PortBusyError(node, port, port_holder(port)) from err
    return server.start()


def close(node: str, server: StoreServer) -> None:
    """Close an attempt's store, saying so if its loop met an error of its own on the way (it went on serving: a
    bug of xrun's, worth a report; the ranks' own errors never count)."""
    server.close()
    if server.loop_error is not None:
        notice(node, f"the store at port {server.port} met an error of its own and went on serving: "
                     f"{type(server.loop_error).__name__}: {server.loop_error} (please report it)")


class AttemptStores:
    """``--elastic``: the store of each rendezvous round, on the node that is rank 0's in that round.

    torch's rendezvous (c10d, etcd) picks rank 0's node and, with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, a free
    port of that node as ``MASTER_PORT``, anew each round; its workers would then host their own store in rank 0
    (``TORCHELASTIC_USE_AGENT_STORE=False``). xrun's agents instead host it, as for a static job: each round closes
    this node's store of the round before and, on rank 0's node, opens a new, empty one at the round's port before
    its workers start, so a restarted group reads nothing of the last (torch's shared store, kept across rounds,
    would hand it every key of the attempts before)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.server: StoreServer | None = None

    def next_round(self, *, rank_0_here: bool, master_addr: str, master_port: int) -> None:
        self.close()
        if rank_0_here:
            self.server = hosted(self.node, listen_address(master_addr), master_port)

    def close(self) -> None:
        if self.server is not None:
            close(self.node, self.server)
            self.server = None
