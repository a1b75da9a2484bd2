"""One control-server connection on its own (``xrun.runner.job.connections``): what it reads goes to its owner as a
hello, as the admitted node's messages, or as the reason it is over; ``Connections`` finds each again by serial,
by node and in the order the unadmitted ones opened."""

from __future__ import annotations

import socket

import pytest

from xrun import channel
from xrun.channel import ChannelError, Kind, Message, message
from xrun.runner.job.connections import Conn, Connections


class Owner:
    """Records what the connection hands on; admits a hello whose node_rank is not None."""

    def __init__(self, *, fail_on: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail_on = fail_on

    def on_hello(self, conn: Conn, msg: Message) -> None:
        self.calls.append(("hello", msg["type"]))
        if msg.get("node_rank") is not None:
            conn.admit(msg["node_rank"])

    def on_message(self, node: int, msg: Message) -> None:
        self.calls.append(("message", node, msg["type"]))
        if msg["type"] == self.fail_on:
            raise ChannelError(f"{msg['type']}: bad field")

    def on_closed(self, conn: Conn, reason: str) -> None:
        self.calls.append(("closed", reason))


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of one loopback TCP connection (a connection tunes TCP options a Unix socket lacks)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        there = socket.create_connection(server.getsockname())
        here, _ = server.accept()
    return here, there


@pytest.fixture
def pair():
    here, there = tcp_pair()
    yield here, there
    here.close()
    there.close()


def opened(sock: socket.socket, owner: Owner, serial: int = 0) -> Conn:
    return Conn.accepted(serial, sock, ("10.0.0.9", 1234), now=0.0, owner=owner)


def test_an_admitted_hello_is_followed_by_the_nodes_messages_read_in_one_go(pair):
    here, there = pair
    owner = Owner()
    conn = opened(here, owner)
    there.sendall(channel.encode(message(Kind.HELLO, node_rank=3)) + channel.encode(message(Kind.READY)))
    conn.read()
    assert owner.calls == [("hello", "hello"), ("message", 3, "ready")]
    assert conn.node == 3 and conn.reader.limit == channel.MAX_FRAME and conn.peer == "10.0.0.9"


def test_what_comes_with_a_hello_not_admitted_is_not_read(pair):
    here, there = pair
    owner = Owner()
    conn = opened(here, owner)
    there.sendall(channel.encode(message(Kind.HELLO)) + channel.encode(message(Kind.READY)))
    conn.read()
    assert owner.calls == [("hello", "hello")] and conn.node is None


def test_a_frame_over_the_hello_limit_before_admission_is_a_protocol_error(pair):
    here, there = pair
    owner = Owner()
    conn = opened(here, owner)
    there.sendall(channel.HEADER.pack(channel.MAX_HELLO + 1))
    conn.read()
    assert owner.calls == [("closed", f"protocol error: frame of {channel.MAX_HELLO + 1} bytes exceeds the "
                                      f"{channel.MAX_HELLO}-byte limit")]


def test_a_malformed_message_closes_its_connection_as_a_protocol_error(pair):
    here, there = pair
    owner = Owner(fail_on="ready")
    conn = opened(here, owner)
    there.sendall(channel.encode(message(Kind.HELLO, node_rank=0)) + channel.encode(message(Kind.READY)))
    conn.read()
    assert owner.calls[-1] == ("closed", "protocol error: ready: bad field")


def test_a_peer_that_closes_is_reported_once_readable(pair):
    here, there = pair
    owner = Owner()
    conn = opened(here, owner)
    there.close()
    conn.read()
    assert owner.calls == [("closed", "connection closed")]


def test_connections_are_found_by_serial_by_node_and_time_out_oldest_first():
    links, owner, socks = Connections(), Owner(), []
    try:
        for at in (0.0, 1.0, 2.0):
            here, there = tcp_pair()
            socks += [here, there]
            links.open(here, ("peer", 0), now=at, owner=owner)
        assert list(links.all) == [0, 1, 2] and links.pending.deadline() == channel.HELLO_TIMEOUT
        links.admit(0, node=5)
        assert links.by_node[5] is links.all[0] and list(links.pending) == [1, 2]
        dropped = []
        for conn in links.pending.expired(1.0 + channel.HELLO_TIMEOUT + 0.5):
            dropped.append(conn.serial)
            links.forget(conn)  # the caller drops each as it comes
        assert dropped == [1] and list(links.pending) == [2]
    finally:
        for sock in socks:
            sock.close()
    links.forget(links.all[0])
    assert 5 not in links.by_node and list(links.all) == [2]
