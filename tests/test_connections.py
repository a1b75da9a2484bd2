"""One control-server connection on its own (``xrun.runner.job.connections``): what it reads it gives back as the
hello, then the admitted node's messages, then the reason it is over, and a peer that breaks the protocol raises;
``Connections`` finds each again by serial, by node and in the order the unadmitted ones opened. That a message
the server cannot take closes its connection (and only that one) is the server's, tested at the end with a real
``ControlServer``.

Every connection is TLS from its first byte, then ``auth`` -> ``challenge`` -> the hello with its proof: the peer
here is a real client (``TlsPipe`` + ``ClientHandshake``) on the other end of a loopback TCP pair, driven step by
step on this one thread (the connection reads only what is already there)."""

from __future__ import annotations

import select
import socket

import pytest

from xrun import channel
from xrun.channel import ChannelError, Kind, Message, message
from xrun.channel.handshake import ClientHandshake, ServerHandshake
from xrun.channel.proof import HEAD_PURPOSE, token_key
from xrun.channel.tls import client_context
from xrun.channel.tls_server import ServerIdentity
from xrun.channel.tlspipe import TlsPipe
from xrun.common.output.status import PlainStatus
from xrun.runner.job.connections import Closed, Conn, Connections
from xrun.runner.job.control_server import ControlServer
from xrun.runner.job.gate import Gate
from xrun.runner.job.keys import NodeKeys
from xrun.runner.job.nodes import NodeState
from xrun.runner.plan import JobRequest, make_plan

IDENTITY = ServerIdentity.mint()
SERVER_TLS = IDENTITY.server_context()
KEY = token_key("t0ken", HEAD_PURPOSE)


def read(conn: Conn) -> list[tuple]:
    """What one ``read`` gives, in order; a hello that proves its node's key is admitted before the next is asked
    for, as the server does."""
    got: list[tuple] = []
    for item in conn.read():
        if isinstance(item, Closed):
            got.append(("closed", item.reason))
        elif conn.node is not None:
            got.append(("message", conn.node, item["type"]))
        else:
            got.append(("hello", item["type"]))
            if conn.handshake.check_hello(item):
                conn.admit(item["node_rank"])
    return got


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


def server_handshake() -> ServerHandshake:
    return ServerHandshake(lambda node: KEY, IDENTITY.fingerprint, prove_server=False)


def opened(sock: socket.socket, serial: int = 0) -> Conn:
    return Conn.accepted(serial, sock, ("10.0.0.9", 1234), now=0.0, tls=SERVER_TLS, handshake=server_handshake())


class Client:
    """The agent's end: TLS, then auth/challenge, each step taken by ``conn`` in its ``read`` (which gives nothing
    back for them)."""

    def __init__(self, sock: socket.socket, conn: Conn) -> None:
        self.sock, self.conn = sock, conn
        self.pipe = TlsPipe(client_context(), sock, server_side=False)
        self.reader = channel.FrameReader()

    def tls(self) -> None:
        """The TLS handshake, the server's half done by ``conn.read``; the pinned certificate checked."""
        done = self.pipe.handshake()  # ClientHello
        while not done:
            assert read(self.conn) == []
            done = self.pipe.handshake(self.sock.recv(65536))
        self.serve()  # the client's Finished
        assert self.conn.secure and self.pipe.fingerprint() == IDENTITY.fingerprint

    def serve(self) -> None:
        """The connection reads until nothing more is on its way (TCP may split what was sent at once)."""
        while select.select([self.conn.sock], [], [], 0.1)[0] and self.conn.sock.fileno() >= 0:
            assert read(self.conn) == []

    def challenged(self, node_rank: int) -> ClientHandshake:
        """TLS, ``auth``, the server's ``challenge`` accepted: ready to prove ``node_rank``'s key."""
        self.tls()
        handshake = ClientHandshake(KEY, IDENTITY.fingerprint, node_rank, expect_server_proof=False)
        self.send(handshake.auth_message())
        self.serve()  # the auth: answered with a challenge
        assert self.conn.challenged and self.conn.node is None
        challenge = self.recv()
        assert handshake.on_challenge(challenge) is None
        return handshake

    def send(self, *msgs: Message) -> None:
        """All of ``msgs`` in one TLS record (the connection reads them in one go)."""
        self.pipe.send(b"".join(channel.encode(msg) for msg in msgs))

    def recv(self) -> Message:
        ready = self.reader.feed(self.pipe.feed(b""))
        while not ready:
            ready = self.reader.feed(self.pipe.feed(self.sock.recv(65536)))
        return ready[0]


def proven_hello(handshake: ClientHandshake) -> Message:
    return message(Kind.HELLO, **handshake.proof_fields())


def test_an_admitted_hello_is_followed_by_the_nodes_messages_read_in_one_go(pair):
    here, there = pair
    conn = opened(here)
    client = Client(there, conn)
    client.send(proven_hello(client.challenged(3)), message(Kind.READY))
    assert read(conn) == [("hello", "hello"), ("message", 3, "ready")]
    assert conn.node == 3 and conn.reader.limit == channel.MAX_FRAME and conn.peer == "10.0.0.9"


def test_what_comes_with_a_hello_not_admitted_is_not_read(pair):
    here, there = pair
    conn = opened(here)
    client = Client(there, conn)
    client.challenged(3)
    client.send(message(Kind.HELLO), message(Kind.READY))  # no proof: not admitted
    assert read(conn) == [("hello", "hello")] and conn.node is None


def test_a_hello_proving_another_nodes_key_is_not_admitted(pair):
    here, there = pair
    conn = opened(here)
    client = Client(there, conn)
    client.send(message(Kind.HELLO, **{**proven_hello(client.challenged(3)), "node_rank": 4}), message(Kind.READY))
    assert read(conn) == [("hello", "hello")] and conn.node is None


def test_a_frame_over_the_hello_limit_before_admission_is_a_protocol_error(pair):
    here, there = pair
    conn = opened(here)
    client = Client(there, conn)
    client.tls()
    client.pipe.send(channel.HEADER.pack(channel.MAX_HELLO + 1))
    with pytest.raises(ChannelError) as err:
        read(conn)
    assert err.value.reason == f"frame of {channel.MAX_HELLO + 1} bytes exceeds the {channel.MAX_HELLO}-byte limit"


def test_bytes_that_are_not_tls_are_a_protocol_error(pair):
    here, there = pair
    conn = opened(here)
    there.sendall(channel.encode(message(Kind.HELLO, node_rank=0)))  # the old plain-text hello
    with pytest.raises(ChannelError, match="^TLS handshake failed"):
        read(conn)


@pytest.mark.parametrize("first", [message(Kind.HELLO, node_rank=0), message(Kind.AUTH, node_rank=0)])
def test_a_first_message_that_is_not_a_well_formed_auth_is_a_protocol_error(pair, first):
    here, there = pair
    conn = opened(here)
    client = Client(there, conn)
    client.tls()
    client.send(first)
    with pytest.raises(ChannelError):
        read(conn)
    assert not conn.challenged


def test_a_peer_that_closes_is_reported_once_readable(pair):
    here, there = pair
    conn = opened(here)
    there.close()
    assert read(conn) == [("closed", "connection closed")]


def test_connections_are_found_by_serial_by_node_and_time_out_oldest_first():
    links, socks = Connections(SERVER_TLS, server_handshake), []
    try:
        for at in (0.0, 1.0, 2.0):
            here, there = tcp_pair()
            socks += [here, there]
            links.open(here, ("peer", 0), now=at)
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


# -- the server's side: a message it cannot take costs its own connection -----------------------------------------


def test_a_malformed_message_closes_its_connection_as_a_protocol_error_and_its_node_is_lost(pair):
    here, there = pair
    plan = make_plan(JobRequest(script="train.py", cwd="/tmp"), {"a": (0,), "b": (0,)}, "ssh")
    gate = Gate(NodeKeys.shared_secret(2, "t0ken"), nodes=2, prove_server=False, identity=IDENTITY)
    server = ControlServer(plan, gate, join_timeout=30.0, status=PlainStatus(2))
    try:
        conn = server.links.open(here, ("10.0.0.9", 0), now=0.0)
        client = Client(there, conn)
        client.send(proven_hello(client.challenged(0)), message(Kind.READY, master_port="29500"))
        server.read_from(conn)  # the hello is admitted (its spec sent), the ready is not an event
        assert client.recv()["type"] == Kind.SPEC.value
        assert conn.sock.fileno() == -1 and not server.conns and server.job.state(0) is NodeState.LOST
        assert server.failure.reason == ("lost node a: its agent's connection dropped (protocol error: ready: "
                                         "master_port is '29500', not an integer)")
    finally:
        server.close()


@pytest.mark.parametrize(("records", "shown"), [
    ([[[0], "from rank 0\n"], [[], "xrun[a]: a notice\n"]], [(1, b"[a:0] from rank 0\nxrun[a]: a notice\n")]),
    ([[[0, 1], "x\n", "extra"]], None),  # a record of the wrong shape
    ([[[1 << 20], "x\n"]], None),  # a rank past any world
])
def test_an_admitted_nodes_console_records_reach_the_console_or_close_its_connection(pair, records, shown):
    """A node's ``lines`` are checked record by record before the head renders any (issue 30 §3): a bad one is a
    protocol error that costs its own connection, and nothing of it reaches the console."""
    here, there = pair
    plan = make_plan(JobRequest(script="train.py", cwd="/tmp"), {"a": (0,), "b": (0,)}, "ssh")
    gate = Gate(NodeKeys.shared_secret(2, "t0ken"), nodes=2, prove_server=False, identity=IDENTITY)
    server = ControlServer(plan, gate, join_timeout=30.0, status=PlainStatus(2))
    written: list[tuple[int, bytes]] = []
    server.console._out = lambda fd, data: written.append((fd, data))
    try:
        conn = server.links.open(here, ("10.0.0.9", 0), now=0.0)
        client = Client(there, conn)
        client.send(proven_hello(client.challenged(0)), message(Kind.LINES, fd=1, host="a", lines=records))
        server.read_from(conn)
        assert client.recv()["type"] == Kind.SPEC.value
        server.console.close()  # two nodes: held for the other node's twins until now
        if shown is not None:
            assert written == shown and server.conns
        else:
            assert written == [] and conn.sock.fileno() == -1 and server.job.state(0) is NodeState.LOST
            assert "protocol error: 'lines': a record: expected" in server.failure.reason
    finally:
        server.close()
