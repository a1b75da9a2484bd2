"""The store torchrun's agent gives its workers (issue 39 §1): ``xrun.launch.store`` against torch's own client.

torch 2.13's ``TCPStore(is_master=False)`` runs in subprocesses (some of its calls, ``multi_get`` and ``list_keys``
among them, hold the GIL while they wait for the answer, so a client in the server's process would stall the
server's thread); the raw client below speaks the wire for the attacks and the pure tables. A gloo job of 4 ranks
with ``TORCHELASTIC_USE_AGENT_STORE=True`` does an all_reduce through it.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, eventually, run_xrun, torchft_missing
from xrun.common.rankplan import LaunchOptions, Rendezvous, node_ranks
from xrun.common.spec import ElasticOptions, NodeSpec, ReplicaGroups
from xrun.errors import PortBusyError
from xrun.launch.store.agent_store import agent_stores, close, hosted, store_endpoints
from xrun.launch.store.server import Limits, StoreServer
from xrun.launch.store.table import Refused, Table
from xrun.launch.store.wire import (
    MAX_KEY_BYTES,
    MAX_KEYS,
    MAX_VALUE_BYTES,
    VALIDATION_MAGIC,
    ProtocolError,
    Query,
    Reader,
    Request,
)
from xrun.net import free_port

pytest.importorskip("torch")


# -- a raw client: the wire as torch's client writes it ----------------------------------------------------------


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def s(data: bytes) -> bytes:
    return u64(len(data)) + data


HELLO = bytes([Query.VALIDATE]) + struct.pack("<I", VALIDATION_MAGIC)


class Raw:
    """One connection, validated, that sends requests and reads exact answers."""

    def __init__(self, port: int, *, validate: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if validate:
            self.sock.sendall(HELLO + bytes([Query.PING]) + struct.pack("<I", 1234))
            assert self.read(4) == struct.pack("<I", 1234)

    def send(self, *parts: bytes) -> None:
        self.sock.sendall(b"".join(parts))

    def read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes")
            out += chunk
        return out

    def vector(self) -> bytes:
        return self.read(struct.unpack("<Q", self.read(8))[0])

    def set(self, key: bytes, value: bytes) -> None:
        self.send(bytes([Query.SET]), s(key), s(value))

    def get(self, key: bytes) -> bytes:
        self.send(bytes([Query.GET]), s(key))
        return self.vector()

    def closed(self, within: float = 5.0) -> bool:
        """Whether the server closed this connection (EOF or reset) within ``within`` seconds."""
        self.sock.settimeout(within)
        try:
            while self.sock.recv(65536):
                pass
        except socket.timeout:
            return False
        except OSError:
            return True
        return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def store():
    with StoreServer("", free_port("127.0.0.1")) as server:
        yield server


def roundtrip(port: int, tag: bytes) -> None:
    """A good client's set and get, answered in full."""
    good = Raw(port)
    good.set(b"/good", tag)
    assert good.get(b"/good") == tag
    good.close()


# -- torch's client, every call ----------------------------------------------------------------------------------

CLIENT = textwrap.dedent(
    """
    import datetime, json, sys, time
    import torch.distributed as dist

    port, libuv = int(sys.argv[1]), sys.argv[2] == "1"
    store = dist.TCPStore("127.0.0.1", port, is_master=False, use_libuv=libuv, timeout=datetime.timedelta(seconds=5))
    out = {}
    store.set("k", b"v1")
    out["get"] = store.get("k").decode()
    out["cas_hit"] = store.compare_set("k", b"v1", b"v2").decode()
    out["cas_miss"] = store.compare_set("k", b"nope", b"v3").decode()
    out["cas_absent"] = store.compare_set("absent", b"x", b"y").decode()
    out["cas_new"] = store.compare_set("new", b"", b"fresh").decode()
    out["add"] = [store.add("n", 5), store.add("n", -7)]
    out["check"] = [store.check(["k", "n"]), store.check(["k", "zz"])]
    store.wait(["k", "n"])
    out["num_keys"] = store.num_keys()
    out["delete"] = [store.delete_key("new"), store.delete_key("new")]
    store.append("k", b"+a")
    store.append("fresh_append", b"b")
    store.multi_set(["m1", "m2"], [b"1", b"2"])
    out["multi_get"] = [v.decode() for v in store.multi_get(["k", "m2", "fresh_append"])]
    store.barrier("alone", 1)
    out["list_keys"] = sorted(store.list_keys())
    if libuv:
        store.queue_push("q", b"one")
        store.queue_push("q", b"two")
        out["queue_len"] = store.queue_len("q")
        out["queue_pop"] = [store.queue_pop("q").decode(), store.queue_pop("q", block=False).decode()]
        try:
            store.queue_pop("q", block=False)
        except dist.QueueEmptyError:
            out["queue_empty"] = True
    start = time.monotonic()
    try:
        store.wait(["never"], datetime.timedelta(milliseconds=200))
    except dist.DistStoreError as err:
        out["wait_timeout"] = [str(err), round(time.monotonic() - start, 1)]
    out["after_cancel"] = store.get("k").decode()  # the connection goes on after CANCEL_WAIT
    out["clone"] = store.clone().get("m1").decode()
    print(json.dumps(out))
    """
)


def run_client(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("libuv", ["1", "0"])
def test_every_call_of_torchs_client(store, libuv):
    done = run_client(CLIENT, str(store.port), libuv)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    expected = {
        "get": "v1", "cas_hit": "v2", "cas_miss": "v2", "cas_absent": "x", "cas_new": "fresh",
        "add": [5, -2], "check": [True, False], "num_keys": 3, "delete": [True, False],
        "multi_get": ["v2+a", "2", "b"],
        "list_keys": ["alone", "fresh_append", "k", "m1", "m2", "n"],
        "wait_timeout": ["wait timeout after 200ms, keys: /never", 0.2],
        "after_cancel": "v2+a", "clone": "1",
    }
    if libuv == "1":  # a use_libuv=False client refuses the queue calls itself, and sends nothing
        expected.update(queue_len=2, queue_pop=["one", "two"], queue_empty=True)
    assert out == expected
    assert eventually(lambda: store.connections == 0)  # both of the client's connections (its own, the clone's) are gone


WAITER = textwrap.dedent(
    """
    import datetime, sys, time
    import torch.distributed as dist

    port, libuv, what = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
    store = dist.TCPStore("127.0.0.1", port, is_master=False, use_libuv=libuv, timeout=datetime.timedelta(seconds=20))
    print("waiting", flush=True)
    start = time.monotonic()
    if what == "get":
        print(store.get("late").decode(), flush=True)
    elif what == "pop":
        print(store.queue_pop("jobs").decode(), flush=True)
    else:
        store.barrier("meet", 2)
        print("met", flush=True)
    print(round(time.monotonic() - start, 1), flush=True)
    """
)


@pytest.mark.parametrize("libuv, what", [("1", "get"), ("0", "get"), ("1", "pop"), ("1", "barrier"), ("0", "barrier")])
def test_a_blocked_client_is_answered_when_its_key_appears(store, libuv, what):
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(store.port), libuv, what],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waiter.stdout.readline() == "waiting\n"
    time.sleep(0.5)
    other = Raw(store.port)
    if what == "get":
        other.set(b"/late", b"here")
    elif what == "pop":
        other.send(bytes([Query.QUEUE_PUSH]), s(b"/jobs"), s(b"a-job"))
    else:
        other.send(bytes([Query.BARRIER]), s(b"/meet"), struct.pack("<q", 2))
        assert other.read(1) == b"\x00"  # the second arrival is answered at once
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    answer, waited = out.split()
    assert answer == {"get": "here", "pop": "a-job", "barrier": "met"}[what]
    assert 0.4 <= float(waited) < 5


# -- a gloo job, as torch's agent would run it ---------------------------------------------------------------------

RANK = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    dist.barrier()
    print(dist.get_rank(), int(value.item()), flush=True)
    dist.destroy_process_group()
    """
)


def test_a_gloo_job_of_4_ranks_meets_through_the_agent_store(store):
    world = 4
    env = {**os.environ, "TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(store.port), "WORLD_SIZE": str(world), "TORCHELASTIC_RESTART_COUNT": "0"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK], env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(world)]
    outs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0] * world, [err for _, err in outs]
    assert sorted(out.strip() for out, _ in outs) == [f"{rank} 10" for rank in range(world)]
    # every rank, rank 0 included, was a client: torch 2.13 puts no attempt prefix on the keys (rendezvous.py:
    # "We create a new TCPStore for every retry"), which is why each attempt needs a store of its own
    check = Raw(store.port)
    check.send(bytes([Query.LIST_KEYS]))
    keys = [check.vector() for _ in range(struct.unpack("<q", check.read(8))[0])]
    assert b"init/" in keys  # each client's arrival, counted (its key has no "/" before it)
    assert any(key.startswith(b"/default_pg/") for key in keys) and not any(b"attempt_" in key for key in keys)


# -- the agent hosts it: a local xrun job, restarted -------------------------------------------------------------

ATTEMPTS = textwrap.dedent(
    """
    import datetime, os, sys, time
    import torch, torch.distributed as dist

    attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=30))
    print("leftover", attempt, rank, store.check(["from_attempt_0"]), flush=True)
    if attempt == 0:
        store.barrier("checked", 2)
        if rank == 0:
            store.set("from_attempt_0", b"stale address")
            time.sleep(60)  # stopped when rank 1 fails
        store.wait(["from_attempt_0"])
        sys.exit(3)
    dist.init_process_group("gloo", init_method="env://")
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    print("sum", attempt, rank, int(value.item()), flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("mode", [[], ["--elastic"]], ids=["static", "elastic"])
def test_each_attempt_of_an_xrun_job_meets_in_a_store_of_its_own(tmp_path, mode):
    """Rank 1 fails attempt 0 after rank 0 set a key; attempt 1 sees none of it and meets through env://. Under
    --elastic too: torch's rendezvous picks each round's port, rank 0's agent hosts a new store there."""
    script = tmp_path / "attempts.py"
    script.write_text(ATTEMPTS)
    done = subprocess.run([sys.executable, "-m", "xrun", *mode, "--num_gpus", "2", "--no_local_rank",
                           "--max_restarts", "1", str(script)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = sorted(line.split("] ", 1)[1] for line in done.stdout.splitlines() if "] " in line)
    assert said == ["leftover 0 0 False", "leftover 0 1 False", "leftover 1 0 False", "leftover 1 1 False",
                    "sum 1 0 3", "sum 1 1 3"]


TORCHFT_JOB = os.path.join(ROOT, "tests", "procs", "torchft_job.py")


@pytest.fixture
def lighthouse(tmp_path):
    """torchft's Lighthouse (``torchft_lighthouse``, beside this interpreter), its address."""
    why = torchft_missing()
    if why:
        pytest.skip(why)
    port = free_port("127.0.0.1")
    program = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    with open(tmp_path / "lighthouse.log", "wb") as log:
        proc = subprocess.Popen([program, "--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms",
                                 "1000", "--bind", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        assert eventually(lambda: _listening(port), within=20), (tmp_path / "lighthouse.log").read_text()
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("mode", [[], ["--elastic"]], ids=["static", "elastic"])
def test_a_torchft_manager_finds_its_store_under_xrun(tmp_path, lighthouse, mode):
    """torchft 0.2.0's ``Manager`` opens ``MASTER_ADDR:MASTER_PORT`` as a client: before the agent hosted a store
    there it waited 300 s and failed ("client socket has timed out"). One replica group of 2 ranks, 3 steps, each a
    Lighthouse quorum, an all-reduce and a commit."""
    done = run_xrun(*mode, "--num_gpus", "2", "--no_local_rank", TORCHFT_JOB, "3", cwd=str(tmp_path), timeout=120,
                    env={"TORCHFT_LIGHTHOUSE": lighthouse, "REPLICA_GROUP_ID": "0"})
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    said = sorted(line.split("] ", 1)[1] for line in done.stdout.splitlines() if "] TORCHFT " in line)
    assert said == ["TORCHFT 0 3 3.0", "TORCHFT 1 3 3.0"], done.stdout[-4000:]


def node_spec(node_rank: int, port: int, **fields) -> NodeSpec:
    world = {"a": (0, 1), "b": (0, 1)}
    ranks = node_ranks(world, node_rank, Rendezvous("127.0.0.1", port, "job"), LaunchOptions(python="py"), "t.py", ())
    return NodeSpec(["a", "b"][node_rank], node_rank, ranks, **fields)


def test_only_the_node_of_rank_0_hosts_a_store_and_only_on_the_static_path():
    assert all(r.env["TORCHELASTIC_USE_AGENT_STORE"] == "True" for r in node_spec(1, 1234).ranks)
    assert store_endpoints(node_spec(0, 1234)) == {0: ("127.0.0.1", 1234)}
    assert store_endpoints(node_spec(1, 1234)) == {}
    assert store_endpoints(node_spec(0, 1234, elastic=ElasticOptions())) == {}  # torch's agent decides
    with agent_stores(node_spec(1, 1234)) as none:
        assert none.servers == {}


def test_each_replica_groups_rank_0_node_hosts_that_groups_store():
    """--replica_groups (issue 39 §2): 2 nodes of 2 ranks in 4 groups: each node runs two groups' rank 0."""
    world = {"a": (0, 1), "b": (0, 1)}
    groups = ReplicaGroups(count=4, master_ports=(2000, 2001, 2002, 2003), lighthouse_port=2004)
    specs = [NodeSpec(host, n, node_ranks(world, n, Rendezvous("10.0.0.1", 2000, "job"), LaunchOptions(python="py"),
                                          "t.py", (), replicas=groups), replicas=groups)
             for n, host in enumerate(world)]
    assert [store_endpoints(spec) for spec in specs] == [{0: ("", 2000), 1: ("", 2001)}, {2: ("", 2002), 3: ("", 2003)}]
    ports = [free_port("127.0.0.1") for _ in range(2)]
    local = replace(groups, count=2, master_ports=tuple(ports))
    spec = NodeSpec("a", 0, node_ranks({"a": (0, 1)}, 0, Rendezvous("127.0.0.1", ports[0], "job"),
                                       LaunchOptions(python="py"), "t.py", (), replicas=local), replicas=local)
    with agent_stores(spec) as stores:
        assert [server.port for server in stores.servers.values()] == ports
        for port in ports:
            roundtrip(port, b"group")
        kept = stores.servers[0]
        stores.renew(1)  # group 1 restarts (supervision by group): a new, empty store; group 0's is the same
        assert stores.servers[0] is kept and stores.servers[1].port == ports[1]
        assert kept._table.size > 0 and stores.servers[1]._table.size == 0
        roundtrip(ports[1], b"again")


@pytest.mark.parametrize(("master", "bound"), [("127.0.0.1", "127.0.0.1"), ("127.0.1.1", "127.0.1.1"), ("::1", "::1"),
                                               ("10.1.2.3", ""), ("node0", ""), ("localhost", "")])
def test_a_loopback_master_keeps_the_store_on_loopback_else_every_address(master, bound):
    """A local run's ranks all reach 127.0.0.1: its store is not open to the network (torch's own listens on every
    address); a master on the network, or a name, which may resolve to another address of this node than the
    others reach, gets every address."""
    world = {"a": (0, 1)}
    ranks = node_ranks(world, 0, Rendezvous(master, 1234, "job"), LaunchOptions(python="py"), "t.py", ())
    assert store_endpoints(NodeSpec("a", 0, ranks)) == {0: (bound, 1234)}


def test_a_local_runs_store_cannot_be_reached_from_the_network():
    port = free_port("127.0.0.1")
    with agent_stores(node_spec(0, port)) as stores:
        (server,) = stores.servers.values()
        roundtrip(port, b"loopback")
        outside = [a for a in _addresses() if not a.startswith("127.")]
        if not outside:
            pytest.skip("this machine has no address besides loopback to try the store from")
        for address in outside:  # this machine's own other addresses: not listening there
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=2).close()


def _addresses() -> list[str]:
    """This machine's IPv4 addresses (``ip -4 -o addr``), loopback included."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=False).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3]


def test_the_agent_store_is_up_inside_its_block_and_gone_after():
    port = free_port("127.0.0.1")
    with agent_stores(node_spec(0, port)) as stores:
        (server,) = stores.servers.values()
        assert server.port == port
        roundtrip(port, b"inside")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_an_error_of_the_stores_own_loop_is_said_when_it_closes(monkeypatch):
    """The loop outlives a bug of its own (kept as loop_error); the attempt's end says it, once, on stderr."""
    said: list[tuple[str, str]] = []
    monkeypatch.setattr("xrun.launch.store.agent_store.notice", lambda host, text: said.append((host, text)))
    server = hosted("a", "127.0.0.1", free_port("127.0.0.1"))
    close("a", server)
    assert said == []
    server = hosted("a", "127.0.0.1", free_port("127.0.0.1"))
    server.loop_error = ValueError("a bug")  # what _run keeps when a turn raises: no real bug to call on
    close("a", server)
    assert said == [("a", f"the store at port {server.port} met an error of its own and went on serving: "
                          "ValueError: a bug (please report it)")]


def test_a_store_port_taken_meanwhile_is_port_busy():
    with StoreServer("", free_port("127.0.0.1")) as holder:
        with pytest.raises(PortBusyError, match=f"port {holder.port} is already in use on a"):
            with agent_stores(node_spec(0, holder.port)):
                pass


# -- the server's life ---------------------------------------------------------------------------------------------


def test_a_fresh_store_holds_nothing():
    port = free_port("127.0.0.1")
    with StoreServer("", port) as first:
        Raw(first.port).set(b"/left", b"over")
    with StoreServer("", port) as second:  # the next attempt's store, on the same port
        client = Raw(second.port)
        client.send(bytes([Query.GETNUMKEYS]))
        assert client.read(8) == struct.pack("<q", 0)
        assert client.get(b"/left") == b""


def test_close_closes_every_socket():
    server = StoreServer("", free_port("127.0.0.1")).start()
    clients = [Raw(server.port) for _ in range(3)]
    half = Raw(server.port)
    half.send(bytes([Query.SET]), u64(5), b"/ha")  # in the middle of a request
    server.close()
    assert all(client.closed(within=2) for client in [*clients, half])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)
    assert server.connections == 0
    server.close()  # twice is fine


def test_a_store_never_started_closes_too():
    server = StoreServer("127.0.0.1", free_port("127.0.0.1"))
    server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)


def test_a_taken_port_fails_at_once():
    with StoreServer("", free_port("127.0.0.1")) as server:
        with pytest.raises(OSError):
            StoreServer("", server.port)


# -- hostile clients cost only themselves --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="not-a-store-client"),
        pytest.param(HELLO + bytes([99]), id="unknown-query"),
        pytest.param(HELLO + bytes([Query.SET]) + u64(MAX_KEY_BYTES + 1), id="oversized-key"),
        pytest.param(HELLO + bytes([Query.SET]) + s(b"/k") + u64(MAX_VALUE_BYTES + 1), id="oversized-value"),
        pytest.param(HELLO + bytes([Query.WAIT]) + u64(MAX_KEYS + 1), id="too-many-keys"),
        pytest.param(HELLO + bytes([Query.SET]) + u64(2**63), id="huge-length"),
        pytest.param(bytes([Query.GET]) + s(b"/k"), id="no-validation"),
        pytest.param(HELLO + HELLO, id="validated-twice"),
        pytest.param(HELLO + bytes([Query.SET]) + s(b"/n") + s(b"x") + bytes([Query.ADD]) + s(b"/n") + u64(1),
                     id="add-to-no-number"),
    ],
)
def test_a_bad_request_closes_its_connection_only(store, attack):
    good = Raw(store.port)
    bad = Raw(store.port, validate=False)
    bad.send(attack)
    assert bad.closed()
    good.set(b"/still", b"served")
    assert good.get(b"/still") == b"served"


def test_a_client_gone_mid_request_or_mid_wait_is_forgotten(store):
    mid = Raw(store.port)
    mid.send(bytes([Query.MULTI_SET]), u64(2), s(b"/a"), s(b"1"), s(b"/b"))  # cut inside the second pair
    waiter = Raw(store.port)
    waiter.send(bytes([Query.WAIT]), u64(1), s(b"/later"))
    mid.close()
    waiter.close()
    time.sleep(0.2)
    roundtrip(store.port, b"after")
    assert eventually(lambda: store.connections == 0)
    assert store._table._awaiting == {} and store._table._waiters == {}


def test_a_slow_client_does_not_hold_up_others(store):
    slow = Raw(store.port)
    slow.send(bytes([Query.SET]), s(b"/slow"), u64(10), b"12345")  # half a value, then silence
    roundtrip(store.port, b"quick")
    slow.send(b"67890")
    assert slow.get(b"/slow") == b"1234567890"


def test_a_client_that_never_reads_is_paused_not_buffered_without_end():
    limits = Limits(out_high_water=1 << 16, max_unsent_bytes=1 << 20)
    with StoreServer("", free_port("127.0.0.1"), limits=limits) as server:
        greedy = Raw(server.port)
        greedy.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        greedy.set(b"/big", b"x" * (1 << 16))
        greedy.sock.settimeout(0.5)
        requests = (bytes([Query.GET]) + s(b"/big")) * 1024
        blocked = False
        try:
            for _ in range(20000):  # up to 20 Gi of answers asked for, none read
                greedy.sock.sendall(requests)
        except socket.timeout:
            blocked = True  # the server stopped reading it: its requests wait in the kernel, not in the server
        assert blocked
        assert server._paused
        assert server._unsent <= limits.out_high_water + (1 << 17)
        roundtrip(server.port, b"unbothered")


def test_connections_past_the_bound_are_closed():
    with StoreServer("", free_port("127.0.0.1"), limits=Limits(max_connections=2)) as server:
        first, second = Raw(server.port), Raw(server.port)
        third = Raw(server.port, validate=False)
        assert third.closed()
        first.set(b"/k", b"v")
        assert second.get(b"/k") == b"v"


def test_requests_in_progress_are_bounded_all_together():
    with StoreServer("", free_port("127.0.0.1"), limits=Limits(max_pending_bytes=1 << 20)) as server:
        halves = [Raw(server.port) for _ in range(3)]
        for half in halves:  # each under the bound for one request, together over the bound for all
            half.send(bytes([Query.SET]), s(b"/half"), u64(1 << 20), b"x" * 400_000)
        assert sum(half.closed(within=1) for half in halves) == 1
        roundtrip(server.port, b"fits")


def test_keys_waited_for_are_bounded_all_together():
    table = validated_table(1, 2)
    table._max_waits = 3
    answers_of(table, 1, Query.WAIT, [b"a", b"b"])
    with pytest.raises(Refused, match="over 3 keys waited for"):
        answers_of(table, 2, Query.WAIT, [b"c", b"d"])
    answers_of(table, 2, Query.SET, [b"a"], [b"1"])  # one of connection 1's keys arrived: room for one more
    assert answers_of(table, 2, Query.WAIT, [b"c"]) == []
    table.forget(1)
    table.forget(2)
    assert table._waits == 0


def test_a_full_store_refuses_the_writer_only():
    with StoreServer("", free_port("127.0.0.1"), limits=Limits(max_store_bytes=4096)) as server:
        hog = Raw(server.port)
        hog.set(b"/hog", b"x" * 8192)
        assert hog.closed()
        roundtrip(server.port, b"small")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(noise=st.binary(max_size=200), validated=st.booleans(), leave_open=st.booleans())
def test_fuzzed_bytes_never_disturb_a_good_client(store, noise, validated, leave_open):
    bad = Raw(store.port, validate=False)
    bad.send((HELLO if validated else b"") + noise)
    good = Raw(store.port)
    good.set(b"/fuzz", noise)
    assert good.get(b"/fuzz") == noise
    good.close()
    if not leave_open:
        bad.close()
    assert store._thread is not None and store._thread.is_alive() and store.loop_error is None


# -- the wire and the table, pure ----------------------------------------------------------------------------------


def test_a_request_trickled_a_byte_at_a_time_is_read_once_whole():
    data = bytes([Query.COMPARE_SET]) + s(b"/key") + s(b"old") + s(b"new") + bytes([Query.GETNUMKEYS])
    reader, got = Reader(), []
    for byte in data:
        reader.feed(bytes([byte]))
        while (request := reader.parse()) is not None:
            got.append(request)
    assert got == [Request(Query.COMPARE_SET, (b"/key",), (b"old", b"new")), Request(Query.GETNUMKEYS)]
    assert reader.pending == 0


def test_an_oversized_length_is_refused_before_its_bytes_arrive():
    reader = Reader()
    reader.feed(bytes([Query.SET]) + u64(MAX_KEY_BYTES + 1))
    with pytest.raises(ProtocolError, match="key of 8193 bytes"):
        reader.parse()


def answers_of(table: Table, conn: int, query: Query, keys=(), values=(), number=0):
    return table.handle(conn, Request(query, tuple(keys), tuple(values), number))


def validated_table(*conns: int, **bounds: int) -> Table:
    table = Table(max_bytes=bounds.get("max_bytes", 1 << 20), max_answer=bounds.get("max_answer", 1 << 20))
    for conn in conns:
        assert answers_of(table, conn, Query.VALIDATE, number=VALIDATION_MAGIC) == []
    return table


def test_a_wait_for_two_keys_ends_with_the_second():
    table = validated_table(1, 2)
    assert answers_of(table, 1, Query.WAIT, [b"a", b"b"]) == []
    assert answers_of(table, 2, Query.SET, [b"a"], [b"1"]) == []
    assert answers_of(table, 2, Query.SET, [b"b"], [b"2"]) == [(1, b"\x00")]
    assert answers_of(table, 2, Query.SET, [b"b"], [b"3"]) == []  # told once


def test_cancel_wait_forgets_the_waiter():
    table = validated_table(1, 2)
    answers_of(table, 1, Query.WAIT, [b"a"])
    assert answers_of(table, 1, Query.CANCEL_WAIT) == [(1, b"\x01")]
    assert answers_of(table, 2, Query.SET, [b"a"], [b"1"]) == []


def test_a_queue_push_wakes_one_waiter_in_arrival_order():
    table = validated_table(1, 2, 3)
    answers_of(table, 1, Query.WAIT, [b"q"])
    answers_of(table, 2, Query.WAIT, [b"q"])
    assert answers_of(table, 3, Query.QUEUE_PUSH, [b"q"], [b"job"]) == [(1, b"\x00")]
    assert answers_of(table, 1, Query.QUEUE_POP, [b"q"]) == [(1, struct.pack("<q", 1) + s(b"job"))]
    assert answers_of(table, 3, Query.QUEUE_PUSH, [b"q"], [b"next"]) == [(2, b"\x00")]


def test_a_barrier_answers_everyone_at_the_last_arrival():
    table = validated_table(1, 2, 3)
    assert answers_of(table, 1, Query.BARRIER, [b"bar"], number=3) == []
    assert answers_of(table, 2, Query.BARRIER, [b"bar"], number=3) == []
    assert sorted(answers_of(table, 3, Query.BARRIER, [b"bar"], number=3)) == [(1, b"\x00"), (2, b"\x00"), (3, b"\x00")]
    assert answers_of(table, 1, Query.GET, [b"bar"]) == [(1, s(b"3"))]


def test_add_reads_a_number_as_std_stoll_does():
    table = validated_table(1)
    answers_of(table, 1, Query.SET, [b"n"], [b"  41 apples"])
    assert answers_of(table, 1, Query.ADD, [b"n"], number=1) == [(1, struct.pack("<q", 42))]
    answers_of(table, 1, Query.SET, [b"big"], [str(2**63 - 1).encode()])
    with pytest.raises(Refused, match="64-bit"):
        answers_of(table, 1, Query.ADD, [b"big"], number=1)


def test_the_store_and_its_answers_are_bounded():
    table = validated_table(1, max_bytes=1000, max_answer=100)
    answers_of(table, 1, Query.SET, [b"k"], [b"x" * 500])
    with pytest.raises(Refused, match="over 1000 bytes"):
        answers_of(table, 1, Query.SET, [b"k2"], [b"y" * 500])
    with pytest.raises(Refused, match="answer of"):
        answers_of(table, 1, Query.MULTI_GET, [b"k"] * 3)
    answers_of(table, 1, Query.DELETE_KEY, [b"k"])
    assert table.size == 0
