"""The control channel under attack, for real (issue 22): a live control server and real agents, not mocks.

* fuzzing: any bytes, any JSON, before TLS, inside TLS, before and after ``auth``, sent to a live head-mode
  ``ControlServer`` on a thread: each connection is dropped, nothing else happens (no node admitted, no failure,
  no pending connection left over, the loop alive) and a real agent still joins; and the agent's side: a fake
  server that passes TLS and the challenge (it knows the key) and then sends garbage gets one line from the agent,
  never a traceback;
* a running head-mode job and a pod-mode job hit mid-run by deep nesting, a lone surrogate, 1,000 random frames
  and a connection flood: every node exits 0;
* 1,500 half-open connections against pod node 0 under ``ulimit -n 1024``: the job exits 0, node 0 spends
  < 0.5 s of CPU per 5 s of flood and < 32 MiB more memory;
* the wire: a relay records every byte between agents and server; no marker secret (env values, an ``HF_TOKEN``,
  a rank's console line) nor the token is in it, and replaying it against a second job does nothing;
* a fake node 0 learns nothing but a nonce; the pdsh race: another user polling ``/proc`` cannot take a node.

Attackers connect from distinct loopback addresses (``127.0.x.y``) where a test needs many connections to reach
the server at all: from one address the server refuses a source that keeps failing (that is tested too).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import random
import re
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tests.headserver import TOKEN, console_of, endpoint_of, head_server
from tests.test_control import RANK, LocalSessions
from xrun import channel
from xrun.channel import Kind, message
from xrun.channel.handshake import ClientHandshake, ServerHandshake
from xrun.channel.proof import HEAD_PURPOSE, token_key
from xrun.channel.tls import client_context
from xrun.channel.tls_server import ServerIdentity
from xrun.channel.tlspipe import TlsPipe, client_handshake
from xrun.common.output.status import PlainStatus
from xrun.common.rankplan import LaunchOptions
from xrun.launch.session.main import main as agent_main
from xrun.runner.job.nodes import NodeState
from xrun.runner.plan import JobRequest, make_plan

KEY = token_key(TOKEN, HEAD_PURPOSE)
DEEP = b"[" * 50_000  # 50 KB of nesting: under MAX_HELLO, so it is decoded (and refused), not just cut off
SURROGATE_HELLO = b'{"type":"hello","proof":"\\ud800","node_rank":0,"token":"\\ud800"}'
_sources = itertools.count()


def source() -> str:
    """A fresh loopback source address: each attacker its own, so the per-source bounds do not hide the server."""
    i = next(_sources)
    return f"127.{10 + i // 62500 % 200}.{i // 250 % 250}.{1 + i % 250}"


def dial(port: int, *, addr: str = "127.0.0.1", src: str | None = None, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.bind((src or source(), 0))
    sock.connect((addr, port))
    return sock


def frame(body: bytes) -> bytes:
    return channel.HEADER.pack(len(body)) + body


def until_closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Read until the server closes the connection (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return False
        try:
            if not sock.recv(65536):
                return True
        except OSError:  # reset: closed too
            return True
    return False


class Stranger:
    """A peer that speaks TLS but knows no key; ``stage`` says how far it goes before its payload."""

    def __init__(self, port: int, *, addr: str = "127.0.0.1", src: str | None = None) -> None:
        self.sock = dial(port, addr=addr, src=src)
        self.pipe = TlsPipe(client_context(), self.sock, server_side=False)

    def tls(self) -> Stranger:
        client_handshake(self.pipe, self.sock, timeout=5.0)
        return self

    def auth(self, node_rank: int = 0) -> dict:
        """TLS, then a well-formed ``auth``: the server's challenge (it proves itself in pod mode, to anyone)."""
        self.tls()
        handshake = ClientHandshake(b"\0" * 32, self.pipe.fingerprint(), node_rank, expect_server_proof=False)
        self.pipe.send(channel.encode(handshake.auth_message()))
        reader = channel.FrameReader()
        ready = reader.feed(self.pipe.feed(b""))
        while not ready:
            raw = self.sock.recv(65536)
            if not raw:
                raise ConnectionError("closed before the challenge")
            ready = reader.feed(self.pipe.feed(raw))
        return ready[0]

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.pipe.send(data)

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------------------------------------------------------
# A live head-mode server on a thread, whose one real agent starts when the test says so


class LateSessions(LocalSessions):
    """``LocalSessions`` whose agents start on ``start()``: the server is attacked first."""

    def __init__(self, plan, endpoint):
        self.plan, self.endpoint, self.procs, self.output = plan, endpoint, {}, {}
        self.started = threading.Event()

    def start(self):
        LocalSessions.__init__(self, self.plan, self.endpoint)
        self.register(None)
        self.started.set()

    def finished(self, lost):
        return self.started.is_set() and super().finished(lost)


@contextlib.contextmanager
def live_head(tmp_path, *, hosts=("a",), env=None) -> Iterator:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    request = JobRequest(script=str(script), launch=LaunchOptions(python=sys.executable), env=env or {},
                         cwd=str(tmp_path))
    plan = make_plan(request, {h: (0,) for h in hosts}, "ssh")
    server = head_server(plan, join_timeout=300, status=PlainStatus(len(hosts)))
    port = server.listen(["127.0.0.1"])
    sessions = LateSessions(plan, endpoint_of(server, port))
    sessions.shown = console_of(server)  # the ranks' lines come over the channel onto the head's console
    codes: list[int] = []
    head = threading.Thread(target=lambda: codes.append(server.run(sessions, own_signals=False)), daemon=True)
    head.start()
    try:
        yield server, port, sessions, head, codes
    finally:
        if not sessions.started.is_set():
            sessions.start()
        head.join(60)
        sessions.terminate()


def quiet(server, head) -> None:
    """Nothing happened but dropped connections: the loop is alive, no node in, no failure, nothing pending."""
    deadline = time.monotonic() + 5
    while server.gate.admission.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert head.is_alive()
    assert server.failure is None and not server.node_conns and server.job.verdict is not None
    assert server.gate.admission.pending == 0 and not server.pending, "a dropped connection is still counted"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
json_messages = st.one_of(
    json_values,
    st.fixed_dictionaries({"type": st.sampled_from([k.value for k in Kind]) | st.text(max_size=8)},
                          optional={"node_rank": json_values, "client_nonce": json_values, "proof": json_values,
                                    "token": json_values, "spec": json_values, "digest": json_values}),
)
payloads = st.one_of(
    st.binary(max_size=3000),
    st.fixed_dictionaries({"type": st.just("spec")}, optional={"spec": json_values | json_messages}).map(
        lambda v: frame(json.dumps(v).encode())),  # what an agent acts on: a spec of any shape
    json_messages.map(lambda v: frame(json.dumps(v).encode())),
    st.lists(json_messages.map(lambda v: frame(json.dumps(v).encode())), min_size=2, max_size=5).map(b"".join),
    st.sampled_from([frame(DEEP), frame(SURROGATE_HELLO), channel.HEADER.pack(channel.MAX_FRAME + 1),
                     b"\x16\x03\x01\x00\x05hello"]),
)


def hit(port: int, stage: str, payload: bytes, *, places_taken: bool = False) -> bool:
    """One stranger: ``payload`` at ``stage``, then its half-close; True when the server closed the connection.
    ``places_taken``: pod mode mid-run, where an ``auth`` for any node is dropped (every place is taken)."""
    if stage == "raw":
        sock = dial(port)
        with contextlib.suppress(OSError):
            sock.sendall(payload)
    else:
        stranger = Stranger(port)
        if stage == "tls":
            stranger.tls()
        else:
            try:
                challenge = stranger.auth()
            except ConnectionError:
                stranger.close()
                if not places_taken:
                    raise
                return True
            assert challenge["type"] == "challenge"
        stranger.send(payload)
        sock = stranger.sock
    with sock:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        return until_closed(sock)


@pytest.mark.slow
def test_fuzzed_connections_cost_only_themselves_and_a_real_agent_still_joins(tmp_path):
    with live_head(tmp_path) as (server, port, sessions, head, codes):

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(stage=st.sampled_from(["raw", "tls", "after auth"]), payload=payloads)
        def attack(stage, payload):
            assert hit(port, stage, payload), "the server kept a connection that sent garbage and hung up"
            quiet(server, head)

        attack()
        strays = server.strays
        assert strays > 0  # the failures were counted, one line at the end
        sessions.start()
        head.join(60)
    assert codes == [0], sessions.output
    assert b"R 0 " in b"".join(sessions.shown)


# ---------------------------------------------------------------------------------------------------------------
# The agent's side: a fake server that knows the key, then garbage


class KnowingServer:
    """A server that passes TLS and the challenge with the run's key (it could be a buggy head), then sends
    ``garbage`` inside TLS (``raw``: under it); ``spec``: first that spec and ``start``, so the garbage reaches a
    running agent."""

    def __init__(self, garbage: bytes, *, spec: dict | None = None, raw: bool = False) -> None:
        self.identity = IDENTITY
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.garbage, self.spec, self.raw = garbage, spec, raw
        self.error: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(30)
        try:
            raw, _ = self.listener.accept()
            raw.settimeout(30)
            with self.identity.server_context().wrap_socket(raw, server_side=True) as sock:
                self._talk(sock)
        except OSError as err:
            self.error.append(str(err))
        finally:
            self.listener.close()

    def _talk(self, sock) -> None:
        handshake = ServerHandshake(lambda node: KEY, self.identity.fingerprint, prove_server=False)
        reader = channel.FrameReader()
        challenge = handshake.on_auth(channel.recv(sock, reader, timeout=30))
        assert not isinstance(challenge, channel.ChannelError)
        channel.send(sock, challenge)
        assert handshake.check_hello(channel.recv(sock, reader, timeout=30))
        if self.spec is not None:
            channel.send(sock, message(Kind.SPEC, spec=self.spec, pick_master_port=False))
            assert channel.recv(sock, reader, timeout=30)["type"] == "ready"
            channel.send(sock, message(Kind.START, master_addr="127.0.0.1", master_port=29500))
            time.sleep(0.3)  # the rank runs
        if self.raw:  # under TLS: bytes that are not this session's records
            os.write(sock.fileno(), self.garbage)
        else:
            sock.sendall(self.garbage)
        time.sleep(0.2)


IDENTITY = ServerIdentity.mint()


def agent_argv(port: int) -> list[str]:
    return [f"--connect=127.0.0.1:{port}", "--node_rank=0", f"--fingerprint={IDENTITY.fingerprint}",
            "--token=env:XRUN_ATTACK_TOKEN"]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(garbage=payloads)
def test_an_agent_given_garbage_by_a_server_that_knows_the_key_exits_with_one_line(garbage):
    fake = KnowingServer(garbage)
    err = io.StringIO()
    os.environ["XRUN_ATTACK_TOKEN"] = TOKEN  # read and removed by the agent, as from an engine's export
    with contextlib.redirect_stderr(err):
        code = agent_main(agent_argv(fake.port))
    fake.thread.join(10)
    lines = err.getvalue().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("xrun.launch"), lines
    assert "Traceback" not in err.getvalue()


def _one_rank_spec(tmp_path) -> dict:
    """One ``sleep 5`` rank: the garbage must stop it long before it ends by itself."""
    from xrun.common.spec import PythonMode

    request = JobRequest(script="sleep", args=("5",), cwd=str(tmp_path),
                         launch=LaunchOptions(mode=PythonMode.NONE, local_rank_arg=False))
    return make_plan(request, {"localhost": (0,)}, "ssh").nodes[0].to_json()


@pytest.mark.slow
@pytest.mark.parametrize(("garbage", "raw"), [
    (frame(DEEP), False), (frame(SURROGATE_HELLO), False), (b"\x17\x03\x03\x00\x10" + b"x" * 16, True),
    (b"".join(frame(random.Random(i).randbytes(50)) for i in range(1000)), False),
], ids=["deep", "surrogate", "forged-record", "random-frames"])
def test_a_running_agent_given_garbage_stops_its_ranks_and_exits_with_one_line(tmp_path, garbage, raw):
    """Inside TLS (the deep nesting, the surrogate, 1,000 random frames) or as a forged TLS record."""
    fake = KnowingServer(garbage, spec=_one_rank_spec(tmp_path), raw=raw)
    env = {**os.environ, "PYTHONPATH": ROOT, "XRUN_ATTACK_TOKEN": TOKEN}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "xrun.launch", *agent_argv(fake.port)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    fake.thread.join(10)
    assert not fake.error, fake.error
    assert time.monotonic() - started < 4.5, "the rank (sleep 5) was not stopped"
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("xrun")], proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# Running jobs hit mid-run: every node exits 0


def barrage(port: int, *, places_taken: bool = False) -> None:
    """Deep nesting, a lone surrogate (in clear and inside TLS, before and after auth), 1,000 random frames over
    50 TLS connections, and a flood of 300 connections (200 sources, then 100 from one) held a moment."""
    for data in (frame(DEEP), frame(SURROGATE_HELLO)):
        hit(port, "raw", data)
        hit(port, "tls", data)
        hit(port, "after auth", data, places_taken=places_taken)
    rng = random.Random(22)
    for _ in range(50):
        stranger = Stranger(port).tls()
        stranger.send(b"".join(frame(rng.randbytes(rng.randrange(1, 200))) for _ in range(20)))
        stranger.close()
    flood = []
    one = source()
    for i in range(300):
        with contextlib.suppress(OSError):
            sock = dial(port, src=one if i >= 200 else None, timeout=2.0)
            if i % 2:
                sock.send(b"\x16\x03\x01\x02\x00\x01")  # half a ClientHello
            flood.append(sock)
    time.sleep(1.0)
    for sock in flood:
        sock.close()


def wait_running(server, nodes: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(server.job.state(node) is NodeState.RUNNING for node in range(nodes)):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_running_head_mode_job_survives_every_attack(tmp_path):
    with live_head(tmp_path, hosts=("a", "b"), env={"SLEEP": "5"}) as (server, port, sessions, head, codes):
        sessions.start()
        wait_running(server, 2)
        started = time.monotonic()
        barrage(port)
        assert time.monotonic() - started < 5, "the attack outlasted the ranks: nothing was tested mid-run"
        head.join(60)
    assert codes == [0], sessions.output
    assert all(proc.returncode == 0 for proc in sessions.procs.values()), sessions.output
    assert server.strays > 0


@pytest.mark.slow
def test_a_running_pod_mode_job_survives_every_attack(tmp_path):
    from tests.test_pod_run import Pod

    pod = Pod(tmp_path, env={"XRUN_TOKEN": "s3cret-0123456789abcdef", "SLEEP": "9"})
    for node in (0, 1, 2):
        pod.start(node)
    time.sleep(3.0)  # joined and running (the ranks sleep 9 s)
    assert all(proc.poll() is None for proc in pod.procs.values())
    barrage(pod.ports[1], places_taken=True)
    out = pod.finish()
    for node, (code, stdout, stderr) in out.items():
        assert code == 0, stderr
        assert f"rank {node} token None" in stdout and "Traceback" not in stderr
    assert "connection(s) that did not prove this run's key" in out[0][1] + out[0][2]


# ---------------------------------------------------------------------------------------------------------------
# A flood of half-open connections against node 0 at the open-files limit

FLOOD = 1500
FLOOD_SECONDS = 5.0


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def open_flood(port: int, count: int) -> list[socket.socket]:
    """``count`` connections from as many sources, each sending half a ClientHello and then nothing."""
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.bind((source(), 0))
        sock.connect_ex(("127.0.0.1", port))
        socks.append(sock)
    time.sleep(0.3)
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    return socks


@pytest.mark.slow
def test_1500_half_open_connections_against_node_0_under_ulimit_1024(tmp_path):
    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))  # the attacker's own
    from tests.test_pod_run import Pod

    pod = Pod(tmp_path, env={"XRUN_TOKEN": "s3cret-0123456789abcdef", "SLEEP": "11"})
    node0 = psutil.Process(pod.start(0, preexec_fn=_limit_open_files).pid)
    pod.start(1)
    pod.start(2)
    time.sleep(3.0)  # joined and running (the ranks sleep 11 s)
    assert node0.rlimit(psutil.RLIMIT_NOFILE) == (1024, 1024)
    rss_before, cpu_before = node0.memory_info().rss, sum(node0.cpu_times()[:2])
    started = time.monotonic()
    flood = open_flood(pod.ports[1], FLOOD)
    peak = rss_before
    while time.monotonic() - started < FLOOD_SECONDS:
        peak = max(peak, node0.memory_info().rss)
        time.sleep(0.1)
    cpu = sum(node0.cpu_times()[:2]) - cpu_before
    for sock in flood:
        sock.close()
    out = pod.finish()
    for node, (code, stdout, stderr) in out.items():
        assert code == 0, stderr
        assert f"rank {node} token None" in stdout and "Traceback" not in stderr
    extra_mib = (peak - rss_before) / 2**20
    print(f"node 0 under a flood of {FLOOD}: {cpu:.3f} s CPU in {FLOOD_SECONDS:g} s, +{extra_mib:.1f} MiB RSS")
    assert cpu < 0.5, f"node 0 spent {cpu:.2f} s of CPU in {FLOOD_SECONDS:g} s of flood"
    assert extra_mib < 32, f"node 0 grew by {extra_mib:.1f} MiB"


# ---------------------------------------------------------------------------------------------------------------
# The wire: a relay between the agents and the server records every byte


class Relay:
    """Listens on its own port and passes each connection on to ``upstream``, recording both directions."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent: list[bytearray] = []  # per connection: what the agent sent
        self.received: list[bytearray] = []  # ... and what the server sent back
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:  # node 0 not listening yet: the agent sees a closed connection and tries again
                down.close()
                continue
            sent, received = bytearray(), bytearray()
            self.sent.append(sent)
            self.received.append(received)
            threading.Thread(target=self._pump, args=(down, up, sent), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, received), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, record: bytearray) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                record += data
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    @property
    def recording(self) -> bytes:
        return b"".join(bytes(b) for b in self.sent + self.received)

    def close(self) -> None:
        self.listener.close()


def replay(port: int, streams: list[bytearray]) -> None:
    """Each recorded agent stream, byte for byte, on a fresh connection; whatever comes back is ignored. A server
    not listening yet (a loaded machine starts node 0 late) is waited for: a refused replay would prove nothing."""
    deadline = time.monotonic() + 30.0
    for stream in streams:
        while True:
            try:
                sock = dial(port, timeout=5.0)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, f"nothing listens on port {port}"
                time.sleep(0.05)
        with contextlib.suppress(OSError), sock:
            sock.sendall(bytes(stream))
            sock.shutdown(socket.SHUT_WR)
            until_closed(sock)


def markers() -> dict[str, str]:
    tag = os.urandom(8).hex()
    return {"SECRET": f"env-value-{tag}", "HF_TOKEN": f"hf_{tag}Zq", "WANDB_API_KEY": f"wandb-{tag}"}


def assert_absent(recording: bytes, secrets: list[str]) -> None:
    assert len(recording) > 1000  # the job really went through the relay
    for secret in secrets:
        for form in {secret.encode(), secret.encode("utf-16-le"), secret.encode().hex().encode()}:
            assert form not in recording, f"{secret!r} is readable on the wire"


@pytest.mark.slow
def test_head_mode_nothing_readable_on_the_wire_and_a_recording_replays_to_nothing(tmp_path):
    secrets = markers()
    with live_head(tmp_path, env=secrets) as (server, port, sessions, head, codes):
        relay = Relay(port)
        sessions.endpoint = endpoint_of(server, relay.port)  # the agents reach the server through the relay
        sessions.start()
        head.join(60)
        relay.close()
    assert codes == [0], sessions.output
    assert secrets["SECRET"].encode() in b"".join(sessions.shown)  # the rank got it: it crossed the relay
    assert_absent(relay.recording, [*secrets.values(), TOKEN, "t0ken"])
    with live_head(tmp_path, env=secrets) as (server, port, sessions, head, codes):
        replay(port, relay.sent)
        assert not server.node_conns and server.failure is None
        sessions.start()
        head.join(60)
    assert codes == [0], sessions.output
    assert server.strays >= len(relay.sent)


MARKER_SCRIPT = """
import os, sys, time
print("console marker", os.environ["MARKER_LINE"], "from", os.environ["GROUP_RANK"], flush=True)
time.sleep(float(os.environ.get("SLEEP", "0.3")))
"""


@pytest.mark.slow
def test_pod_mode_nothing_readable_on_the_wire_and_a_recording_replays_to_nothing(tmp_path):
    from tests.test_pod_run import Pod

    secret = "pod-secret-" + os.urandom(8).hex()
    line = "line-" + os.urandom(8).hex()
    (tmp_path / "marker.py").write_text(MARKER_SCRIPT)
    env_secrets = markers()  # in pod mode no spec travels: each node's ranks inherit its own xrun's environment
    pod = Pod(tmp_path, env={"XRUN_TOKEN": secret, "MARKER_LINE": line, **env_secrets})
    relay = Relay(pod.ports[1])
    pod.start(0, script="marker.py")
    for node in (1, 2):
        pod.start(node, script="marker.py", control_port=relay.port)  # not in the digest: only where to connect
    out = pod.finish()
    relay.close()
    assert [code for code, _, _ in out.values()] == [0, 0, 0], out
    assert f"console marker {line} from 2" in out[0][1]  # node 2's line reached node 0's console: over the relay
    assert len(relay.sent) >= 2  # one per node, and any tried again before node 0 listened
    assert_absent(relay.recording, [secret, line, *env_secrets.values()])
    again = Pod(tmp_path, env={"XRUN_TOKEN": secret, "MARKER_LINE": line})
    again.ports = pod.ports  # the same run id: the same key as the recorded job's
    again.start(0, script="marker.py")
    time.sleep(1.0)
    replay(again.ports[1], relay.sent)
    for node in (1, 2):
        again.start(node, script="marker.py")
    out = again.finish()
    assert [code for code, _, _ in out.values()] == [0, 0, 0], out
    replayed = [stream for stream in relay.sent if stream]
    closed = re.search(r"closed (\d+) connection\(s\) that did not prove this run's key", out[0][2])
    assert closed and int(closed.group(1)) >= len(replayed) >= 2, out[0][2]


# ---------------------------------------------------------------------------------------------------------------
# A fake node 0 (pod mode) learns nothing


class FakeNode0:
    """Listens on node 0's control port first, with a certificate of its own, and answers ``auth`` with a
    challenge that proves a key it made up (``answer``: "wrong proof") or no key at all ("no proof")."""

    def __init__(self, port: int, answer: str) -> None:
        self.identity = ServerIdentity.mint()
        self.listener = socket.create_server(("127.0.0.1", port))
        self.answer = answer
        self.heard: list[dict] = []  # every message the agent sent, decrypted
        self.after_challenge = b""  # plaintext bytes after the challenge: must stay empty
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            raw, _ = self.listener.accept()
            with self.identity.server_context().wrap_socket(raw, server_side=True) as sock:
                sock.settimeout(10)
                reader = channel.FrameReader()
                self.heard.append(channel.recv(sock, reader, timeout=10))
                handshake = ServerHandshake(lambda node: os.urandom(32), self.identity.fingerprint,
                                            prove_server=self.answer == "wrong proof")
                challenge = handshake.on_auth(self.heard[0])
                channel.send(sock, challenge)
                with contextlib.suppress(OSError):
                    while data := sock.recv(65536):
                        self.after_challenge += data

    def close(self) -> None:
        self.listener.close()


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["wrong proof", "no proof"])
def test_pod_mode_a_fake_node_0_learns_nothing_but_a_nonce(tmp_path, answer):
    from tests.test_pod_run import Pod

    secret = "pod-secret-" + os.urandom(8).hex()
    pod = Pod(tmp_path, env={"XRUN_TOKEN": secret})
    fake = FakeNode0(pod.ports[1], answer)
    started = time.monotonic()
    pod.start(1)
    out = pod.finish(timeout=60)
    fake.close()
    code, stdout, stderr = out[1]
    assert code != 0 and time.monotonic() - started < 15  # refused at once, not after --join_timeout
    assert "node 0 could not prove this job's secret" in stderr and "Traceback" not in stderr, stderr
    assert [sorted(msg) for msg in fake.heard] == [["client_nonce", "node_rank", "type"]]
    assert fake.heard[0]["type"] == "auth" and fake.heard[0]["node_rank"] == 1
    assert fake.after_challenge == b""  # no hello, no proof, no digest, no console line


# ---------------------------------------------------------------------------------------------------------------
# The pdsh race: another user polling /proc cannot take a node

THIEF = r"""
import json, os, socket, sys, time
from xrun import channel
from xrun.channel.handshake import ClientHandshake
from xrun.channel.proof import HEAD_PURPOSE, token_key
from xrun.channel.tls import client_context
from xrun.channel.tlspipe import TlsPipe, client_handshake

def argv_of(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
    except OSError:
        return []

def steal(args):
    opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
    host, port = opts["connect"].rsplit(":", 1)
    node = int(opts["node_rank"])
    report = {"node": node, "uid": os.getuid(), "argv": args, "got": []}
    for guess in [a for a in args if a] or ["-"]:  # every word of the command line, as a key
        sock = socket.create_connection((host, int(port)), timeout=5)
        pipe = TlsPipe(client_context(), sock, server_side=False)
        try:
            client_handshake(pipe, sock, timeout=5)
            hs = ClientHandshake(token_key(guess, HEAD_PURPOSE), pipe.fingerprint(), node, expect_server_proof=False)
            pipe.send(channel.encode(hs.auth_message()))
            reader, got = channel.FrameReader(), []
            while True:
                raw = sock.recv(65536)
                if not raw:
                    break
                for msg in reader.feed(pipe.feed(raw)):
                    got.append(msg.get("type"))
                    if msg.get("type") == "challenge" and not hs.on_challenge(msg):
                        pipe.send(channel.encode(channel.message(channel.Kind.HELLO, **hs.proof_fields(),
                                                                 host="thief", pid=1, addr="127.0.0.1")))
            report["got"].append(got)
        except Exception as err:
            report["got"].append([f"error {err.__class__.__name__}"])
        finally:
            sock.close()
    print(json.dumps(report), flush=True)

seen, deadline = set(), time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid not in seen:
            args = argv_of(pid)
            target = f"--connect=127.0.0.1:{sys.argv[2]}"  # this job's agents (other runs may share the machine)
            if "xrun.launch" in args and target in args:
                seen.add(pid)
                steal(args)
    time.sleep(0.001)
"""


class AnnouncingSessions:
    """Agents started as pdsh starts them (``--token=announce``), their stderr relayed into the server through
    the announcement filter as ``launcher_process`` relays pdsh's (only the head reads that stream)."""

    def __init__(self, plan, endpoint, *, delay: float) -> None:
        from xrun.channel.announce import AnnouncementFilter
        from xrun.runner.backends.channel import agent_connect_argv

        self.delay, self.output, self.procs = delay, {}, {}
        self.filters = {node.host: AnnouncementFilter() for node in plan.nodes}
        self.argv = {node.host: agent_connect_argv(sys.executable, endpoint, str(node.node_rank),
                                                   token_on_stdin=False) for node in plan.nodes}

    def register(self, loop) -> None:
        for host, argv in self.argv.items():
            # the agent waits before it starts: a thief polling /proc has all the time it wants
            cmd = [sys.executable, "-c", f"import time, os, sys; time.sleep({self.delay}); "
                   "os.execv(sys.argv[1], sys.argv[1:])", *argv]
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
            self.procs[host], self.output[host] = proc, b""
            os.set_blocking(proc.stderr.fileno(), False)
            loop.add_reader(proc.stderr, lambda h=host, p=proc: self._relay(loop, h, p))
            threading.Thread(target=lambda h=host, p=proc: self._stdout(h, p), daemon=True).start()

    def _stdout(self, host, proc) -> None:
        self.output[host] += proc.stdout.read()

    def _relay(self, loop, host, proc) -> None:
        chunk = b""
        with contextlib.suppress(BlockingIOError):
            chunk = proc.stderr.read(65536) or b""
        if not chunk:
            loop.remove_reader(proc.stderr)
            return
        shown, announced = self.filters[host].feed(chunk)
        self.output[host] += shown
        for node, key_hex in announced:
            loop.key_announced(node, key_hex)

    def finished(self, lost) -> bool:
        return all(p.poll() is not None for p in self.procs.values())

    def terminate(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
            proc.wait()


@pytest.mark.slow
def test_pdsh_race_another_user_reading_proc_cannot_take_a_node(tmp_path):
    from xrun.runner.job.control_server import ControlServer
    from xrun.runner.job.gate import Gate
    from xrun.runner.job.keys import NodeKeys

    script = tmp_path / "rank.py"
    script.write_text(RANK)
    os.chmod(tmp_path, 0o755)
    request = JobRequest(script=str(script), launch=LaunchOptions(python=sys.executable), cwd=str(tmp_path),
                         env={"SECRET": "only-for-the-ranks", "SLEEP": "1"})
    plan = make_plan(request, {"a": (0,), "b": (0,)}, "pdsh")
    gate = Gate(NodeKeys.announced(2), nodes=2, prove_server=False)
    server = ControlServer(plan, gate, join_timeout=60, status=PlainStatus(2))
    port = server.listen(["127.0.0.1"])
    thief = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                              "-c", THIEF, "20", str(port)], stdout=subprocess.PIPE, text=True, cwd="/",
                             env={"PATH": os.environ["PATH"], "PYTHONPATH": ROOT})
    time.sleep(1.0)  # the thief is polling before any agent exists
    sessions = AnnouncingSessions(plan, endpoint_of(server, port), delay=1.5)
    shown = console_of(server)  # the ranks' lines come over the channel onto the head's console
    code = server.run(sessions, own_signals=False)
    thief.terminate()
    stolen = [json.loads(line) for line in thief.communicate(timeout=30)[0].splitlines()]
    assert code == 0, sessions.output
    console = b"".join(shown)
    for node in (0, 1):
        assert re.search(rb"R %d .* only-for-the-ranks" % node, console), console
    assert b"xrun-key" not in console + b"".join(sessions.output.values())  # the announcement never shows
    assert stolen and {report["node"] for report in stolen} == {0, 1}, "the thief never saw an agent's argv"
    assert all(report["uid"] != 0 for report in stolen)
    for report in stolen:
        for got in report["got"]:
            assert "spec" not in got and "accept" not in got, report  # a challenge at most, then closed
    assert server.strays >= sum(len(report["got"]) for report in stolen)  # every try closed, counted
