"""The channel's security primitives (issue 22): proofs, the handshake machines, TLS, admission; pure first, then
over real TLS sockets on loopback (a server thread, a client, a fake server, a man in the middle, a replay)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import resource
import selectors
import socket
import ssl
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import ROOT
from xrun import channel
from xrun.channel import ChannelError, Kind, message, proof, tls, tls_server
from xrun.channel.admission import Admission, PendingLimits, fd_headroom
from xrun.channel.handshake import ClientHandshake, ServerHandshake
from xrun.channel.link import Credentials, open_link
from xrun.runner.job.connections import Closed, Conn
from xrun.runner.job.gate import descriptor_room, limits_for

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
FP = "a1" * 32  # the server certificate's fingerprint
OTHER_FP = "b2" * 32  # a man in the middle's
CN, SN = b"\x01" * 32, b"\x02" * 32


# ---------------------------------------------------------------------------------------------------------------
# proof.py


def test_derive_key_is_hmac_sha256_over_the_length_prefixed_label_and_purpose():
    """A known answer, built by hand: the encoding is the wire contract between two xrun versions."""
    data = b"\x00\x00\x00\x13xrun channel key v1" + b"\x00\x00\x00\x03pod"
    assert proof.derive_key(b"s3cret", "pod") == hmac.new(b"s3cret", data, hashlib.sha256).digest()
    assert proof.derive_key(b"s3cret", "pod") != proof.derive_key(b"s3cret", "head")


@given(key=st.binary(max_size=200), data=st.binary(max_size=300))
def test_hmac_sha256_is_the_standard_librarys(key, data):
    """xrun computes HMAC over the built-in SHA-256 (proof's module doc): it must be hmac's, byte for byte, for keys
    shorter than, as long as and longer than the 64-byte block."""
    assert proof.hmac_sha256(key, data) == hmac.digest(key, data, "sha256")
    assert proof.sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_hmac_sha256_rfc4231_case_6():
    """A published test vector (a 131-byte key, hashed first)."""
    digest = proof.hmac_sha256(b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First")
    assert digest.hex() == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"


def test_same_hex_compares_whole_values_only():
    assert proof.same_hex("ab" * 32, "ab" * 32, 64)
    assert not proof.same_hex("ab" * 32, "ab" * 31 + "ac", 64)
    assert not proof.same_hex("ab" * 32, ("ab" * 32).upper(), 64) and not proof.same_hex("ab" * 32, None, 64)


def test_client_proof_known_answer():
    fields = [b"xrun client v1", FP.encode(), CN, SN, b"7"]
    data = b"".join(len(f).to_bytes(4, "big") + f for f in fields)
    assert proof.client_proof(KEY, FP, CN, SN, 7) == hmac.new(KEY, data, hashlib.sha256).hexdigest()


def test_every_input_changes_the_proof():
    base = proof.client_proof(KEY, FP, CN, SN, 1)
    variants = [proof.client_proof(OTHER_KEY, FP, CN, SN, 1), proof.client_proof(KEY, OTHER_FP, CN, SN, 1),
                proof.client_proof(KEY, FP, SN, SN, 1), proof.client_proof(KEY, FP, CN, CN, 1),
                proof.client_proof(KEY, FP, CN, SN, 2), proof.client_proof(KEY, FP, SN, CN, 1)]
    assert base not in variants and len(set(variants)) == len(variants)


def test_a_server_proof_is_never_a_client_proof():
    """Domain separation: a server's answer cannot be reflected back to it as a client's proof."""
    assert proof.server_proof(KEY, FP, CN, SN) != proof.client_proof(KEY, FP, CN, SN, 0)
    assert len(proof.server_proof(KEY, FP, CN, SN)) == 64


def test_fields_are_length_prefixed_so_boundaries_cannot_shift():
    assert proof._encode(b"ab", b"c") != proof._encode(b"a", b"bc")


def test_stretch_is_pbkdf2():
    assert proof.stretch(b"pw", b"run", iterations=10) == hashlib.pbkdf2_hmac("sha256", b"pw", b"xrun stretch v1run", 10)


def test_nonces_are_fresh():
    assert len({proof.new_nonce() for _ in range(100)}) == 100 and len(proof.new_nonce()) == 32


@pytest.mark.parametrize("offered", [None, 1, b"x", ["x"], "", "A" * 64, "g" * 64, "0" * 63, "0" * 65, "\ud800" * 64,
                                     "٠" * 64, "0" * 63 + "\n"])
def test_verify_refuses_anything_malformed_without_raising(offered):
    assert proof.verify("0" * 64, offered) is False


def test_verify_accepts_only_the_exact_proof():
    good = proof.client_proof(KEY, FP, CN, SN, 0)
    assert proof.verify(good, good)
    assert not proof.verify(good, good[:-1] + ("0" if good[-1] != "0" else "1"))


@given(st.one_of(st.none(), st.integers(), st.text(), st.binary(), st.lists(st.text())))
def test_verify_never_raises(offered):
    assert proof.verify("0" * 64, offered) in (True, False)


# ---------------------------------------------------------------------------------------------------------------
# handshake.py: the two machines, pure


def _session(*, server_key=KEY, client_key=KEY, seen=FP, prove_server=True, node_rank=3, claimed=None):
    """Run one handshake through both machines; (the server's verdict or the client's refusal, server, client)."""
    server = ServerHandshake(lambda rank: server_key, FP, prove_server=prove_server)
    client = ClientHandshake(client_key, seen, node_rank, expect_server_proof=prove_server)
    challenge = server.on_auth(client.auth_message())
    assert isinstance(challenge, dict)
    refused = client.on_challenge(challenge)
    if refused is not None:
        return refused, server, client
    hello = message(Kind.HELLO, **client.proof_fields())
    if claimed is not None:
        hello["node_rank"] = claimed
    return server.check_hello(hello), server, client


@pytest.mark.parametrize("prove_server", [False, True], ids=["head", "pod"])
def test_a_client_with_the_key_gets_in(prove_server):
    verdict, server, _ = _session(prove_server=prove_server)
    assert verdict is True and server.node_rank == 3


def test_head_mode_a_wrong_key_is_refused_by_the_server():
    assert _session(client_key=OTHER_KEY, prove_server=False)[0] is False


def test_pod_mode_a_server_without_the_key_is_refused_by_the_client_before_it_proves_anything():
    refused, _, client = _session(server_key=OTHER_KEY)
    assert isinstance(refused, ChannelError) and "could not prove" in refused.reason
    with pytest.raises(RuntimeError):
        client.proof_fields()  # the client has no proof to give a server that failed


def test_pod_mode_a_man_in_the_middle_cannot_pass_the_server_proof_on():
    """The client saw the middleman's certificate; the real server proved over its own."""
    refused, _, _ = _session(seen=OTHER_FP)
    assert isinstance(refused, ChannelError)


def test_head_mode_a_proof_made_through_a_middleman_is_worthless_at_the_server():
    assert _session(seen=OTHER_FP, prove_server=False)[0] is False


def test_a_proof_for_one_node_does_not_claim_another():
    assert _session(claimed=4)[0] is False


def test_a_recorded_handshake_replays_to_nothing():
    server = ServerHandshake(lambda rank: KEY, FP, prove_server=False)
    client = ClientHandshake(KEY, FP, 0, expect_server_proof=False)
    auth = client.auth_message()
    assert client.on_challenge(server.on_auth(auth)) is None
    hello = message(Kind.HELLO, **client.proof_fields())
    assert server.check_hello(hello)
    fresh = ServerHandshake(lambda rank: KEY, FP, prove_server=False)
    assert isinstance(fresh.on_auth(auth), dict)  # a fresh server nonce ...
    assert fresh.check_hello(hello) is False  # ... so the old proof is worthless


def test_the_server_machine_is_single_use():
    server = ServerHandshake(lambda rank: KEY, FP, prove_server=False)
    client = ClientHandshake(KEY, FP, 0, expect_server_proof=False)
    assert server.check_hello(message(Kind.HELLO, proof="0" * 64, node_rank=0)) is False  # no auth yet
    auth = client.auth_message()
    client.on_challenge(server.on_auth(auth))
    assert isinstance(server.on_auth(auth), ChannelError)  # auth twice
    hello = message(Kind.HELLO, **client.proof_fields())
    assert server.check_hello(hello) and not server.check_hello(hello)


def test_a_failed_hello_spends_the_handshake():
    """One guess per connection: a wrong proof, then the right one, is still refused."""
    server = ServerHandshake(lambda rank: KEY, FP, prove_server=False)
    client = ClientHandshake(KEY, FP, 0, expect_server_proof=False)
    client.on_challenge(server.on_auth(client.auth_message()))
    assert not server.check_hello(message(Kind.HELLO, proof="0" * 64, node_rank=0))
    assert not server.check_hello(message(Kind.HELLO, **client.proof_fields()))


def test_what_an_admitted_connection_keeps_refuses_everything():
    spent = ServerHandshake.spent()
    client = ClientHandshake(KEY, FP, 0, expect_server_proof=False)
    assert isinstance(spent.on_auth(client.auth_message()), ChannelError)
    assert spent.check_hello(message(Kind.HELLO, proof="0" * 64, node_rank=0)) is False


def test_pod_mode_no_key_for_the_node_drops_the_connection_at_auth():
    server = ServerHandshake(lambda rank: None, FP, prove_server=True)
    assert isinstance(server.on_auth(ClientHandshake(KEY, FP, 9, expect_server_proof=True).auth_message()),
                      ChannelError)


def test_head_mode_looks_the_key_up_when_the_hello_arrives():
    """The node's one-time key reaches the head over the engine's output; it may come after the auth."""
    keys: dict[int, bytes] = {}
    server = ServerHandshake(keys.get, FP, prove_server=False)
    client = ClientHandshake(KEY, FP, 2, expect_server_proof=False)
    assert client.on_challenge(server.on_auth(client.auth_message())) is None
    keys[2] = KEY
    assert server.check_hello(message(Kind.HELLO, **client.proof_fields()))


def test_a_node_whose_place_is_taken_gets_no_key_and_no_entry():
    server = ServerHandshake(lambda rank: None, FP, prove_server=False)
    client = ClientHandshake(KEY, FP, 2, expect_server_proof=False)
    client.on_challenge(server.on_auth(client.auth_message()))
    assert not server.check_hello(message(Kind.HELLO, **client.proof_fields()))


@pytest.mark.parametrize("challenge", [
    {"type": "challenge"}, {"type": "challenge", "server_nonce": "00" * 31}, {"type": "spec", "server_nonce": "00" * 32},
    {"type": "challenge", "server_nonce": "00" * 32},  # pod mode: no server proof
    {"type": "challenge", "server_nonce": "00" * 32, "server_proof": "00" * 32},
])
def test_a_client_refuses_a_bad_challenge(challenge):
    assert isinstance(ClientHandshake(KEY, FP, 0, expect_server_proof=True).on_challenge(challenge), ChannelError)


def test_a_client_refuses_a_second_challenge():
    server = ServerHandshake(lambda rank: KEY, FP, prove_server=True)
    client = ClientHandshake(KEY, FP, 0, expect_server_proof=True)
    challenge = server.on_auth(client.auth_message())
    assert client.on_challenge(challenge) is None
    assert isinstance(client.on_challenge(challenge), ChannelError)


ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=70),
                   lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                   max_leaves=8)
FIELDS = st.sampled_from(["type", "client_nonce", "node_rank", "proof", "server_nonce", "server_proof"])
NEAR = st.sampled_from(["auth", "hello", "challenge", "00" * 32, "0" * 64, 0, 1, True, -1]) | ANY
MESSAGES = st.dictionaries(FIELDS, NEAR, max_size=6)


@given(MESSAGES, MESSAGES, st.booleans())
def test_the_server_machine_takes_any_messages_without_raising(auth, hello, prove_server):
    server = ServerHandshake(lambda rank: KEY if rank < 4 else None, FP, prove_server=prove_server)
    reply = server.on_auth(auth)
    assert isinstance(reply, (dict, ChannelError))
    assert server.check_hello(hello) in (True, False)


@given(MESSAGES, st.booleans())
def test_the_client_machine_takes_any_challenge_without_raising(challenge, expect_server_proof):
    client = ClientHandshake(KEY, FP, 0, expect_server_proof=expect_server_proof)
    verdict = client.on_challenge(challenge)
    assert verdict is None or isinstance(verdict, ChannelError)


# ---------------------------------------------------------------------------------------------------------------
# tls.py and the import cost


def test_import_xrun_channel_loads_neither_ssl_nor_cryptography():
    """A local run never opens a channel: it must not pay ~5-7 ms for ssl (issue 22)."""
    code = ("import sys, xrun.channel\n"
            "print(json.dumps(sorted(m for m in ('ssl', '_ssl', 'cryptography', 'hmac') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert json.loads(out) == []


def test_an_agent_opening_a_channel_does_not_load_cryptography():
    code = ("import sys\nfrom xrun.channel import tls\ntls.client_context()\n"
            "print('ssl' in sys.modules, 'cryptography' in sys.modules, 'xrun.channel.tls_server' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.split() == ["True", "False", "False"]


@pytest.fixture(scope="module")
def identity():
    return tls_server.ServerIdentity.mint()


def test_the_fingerprint_is_the_sha256_of_the_der_certificate(identity):
    der = ssl.PEM_cert_to_DER_cert(identity.cert_pem.decode())
    assert identity.fingerprint == hashlib.sha256(der).hexdigest()


def test_each_run_mints_its_own_p256_key_and_the_repr_hides_it(identity):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(identity.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert tls_server.ServerIdentity.mint().fingerprint != identity.fingerprint
    assert "PRIVATE" not in repr(identity) and identity.fingerprint in repr(identity)


def test_a_single_threaded_server_mints_in_a_child_and_never_loads_cryptography():
    """Issue 22 §7: the head holding 10,000 sessions does not carry ``cryptography`` (~12 MiB) for the run."""
    code = ("import hashlib, ssl, sys\nfrom xrun.channel.tls_server import ServerIdentity\n"
            "made = ServerIdentity.mint_apart()\nmade.server_context()\n"
            "der = ssl.PEM_cert_to_DER_cert(made.cert_pem.decode())\n"
            "print('cryptography' in sys.modules, made.fingerprint == hashlib.sha256(der).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.split() == ["False", "True"]


def test_with_other_threads_running_the_server_mints_in_process(monkeypatch):
    import threading

    monkeypatch.setattr(threading, "active_count", lambda: 2)
    monkeypatch.setattr(tls_server.os, "fork", lambda: pytest.fail("forked with threads running"))
    made = tls_server.ServerIdentity.mint_apart()
    assert isinstance(made.server_context(), ssl.SSLContext)


def test_contexts_speak_tls13_only_and_the_client_pins_instead_of_checking_names(identity):
    server, client = identity.server_context(), tls.client_context()
    assert server.minimum_version == client.minimum_version == ssl.TLSVersion.TLSv1_3
    assert (client.check_hostname, client.verify_mode) == (False, ssl.CERT_NONE)
    assert server.verify_mode == ssl.CERT_NONE  # no client certificate: the agent proves a key instead
    assert server.num_tickets == 0


def test_without_memfd_the_key_file_is_gone_once_loaded(identity, tmp_path, monkeypatch):
    import os
    import tempfile

    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert isinstance(identity.server_context(), ssl.SSLContext)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("actual", "ok"), [("a1" * 32, True), ("A1" * 32, False), ("a1" * 31, False), (None, False),
                                            ("a1" * 31 + "a2", False), ("\ud800" * 64, False)])
def test_pin_ok(actual, ok):
    assert tls.pin_ok("a1" * 32, actual) is ok


# ---------------------------------------------------------------------------------------------------------------
# Over real TLS sockets on loopback: a server thread, a client, and what stands between them.

SPEC_MARKER = "spec-marker-7f3a"  # an env value the server sends after the hello
HELLO_MARKER = "hello-marker-c41d"  # what the client says in its hello (its host name)


@dataclass
class Served:
    received: list = field(default_factory=list)  # every message the server decoded, in order
    proven: int | None = None  # the node rank whose hello proved itself
    error: str | None = None  # why the connection ended early


def _listen():
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(10)
    return sock


def _address(listener):
    return listener.getsockname()[:2]


class _Recording:
    """The server's handshake machine, keeping the ``auth`` that the control server's connection answers itself."""

    def __init__(self, handshake, served):
        self.handshake, self.served = handshake, served

    def on_auth(self, msg):
        self.served.received.append(msg)
        return self.handshake.on_auth(msg)


def _serve(listener, ctx, handshake):
    """One connection, the server's side as the control server runs it (``Conn``: TLS driven non-blocking by a
    selector, ``auth`` answered with a challenge), then the hello checked and the spec sent."""
    served = Served()
    sock, peer = listener.accept()
    conn = Conn.accepted(0, sock, peer, now=time.monotonic(), tls=ctx, handshake=_Recording(handshake, served))
    deadline = time.monotonic() + 10
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(sock.fileno(), selectors.EVENT_READ)
            while served.error is None and served.proven is None:
                if not selector.select(deadline - time.monotonic()):
                    raise ChannelError("timed out")
                for got in conn.read():
                    if isinstance(got, Closed):
                        served.error = got.reason
                        break
                    served.received.append(got)
                    if not handshake.check_hello(got):
                        raise ChannelError("hello refused")
                    served.proven = handshake.node_rank
                    conn.admit(served.proven)
                    conn.send(message(Kind.SPEC, env={"HF_TOKEN": SPEC_MARKER}))
                    break
    except (ChannelError, OSError) as err:
        served.error = getattr(err, "reason", None) or str(err)
    finally:
        conn.close()
    return served


def _hello(proof_fields):
    return message(Kind.HELLO, **proof_fields, host=HELLO_MARKER, pid=1, addr="127.0.0.1", versions={})


def _client(addr, key, node_rank=1, *, pin=None):
    """The agent's side as an agent opens it (``open_link``: TLS, the pinned certificate or, without a pin, the
    server's proof first, then its own proof and the hello); the server's answer, or a ChannelError."""
    sock = socket.create_connection(addr, timeout=5)
    try:
        link = open_link(sock, Credentials(key, pin), node_rank, _hello, timeout=5)
        return link.recv(timeout=5)
    finally:
        sock.close()


def _tls_client(addr):
    """A TLS client that is not an agent (a middleman's upstream end, a replayer): TLS and nothing more."""
    return tls.client_context().wrap_socket(socket.create_connection(addr, timeout=5))


def _in_thread(fn, *args):
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def _server_handshake(identity, key, *, pod):
    return ServerHandshake(lambda rank: key if rank < 4 else None, identity.fingerprint, prove_server=pod)


@pytest.mark.parametrize("pod", [False, True], ids=["head-pinned", "pod-mutual"])
def test_loopback_handshake_admits_the_node_and_carries_the_spec(identity, pod):
    with _listen() as listener:
        server = _in_thread(_serve, listener, identity.server_context(), _server_handshake(identity, KEY, pod=pod))
        reply = _client(_address(listener), KEY, 2, pin=None if pod else identity.fingerprint)
        served = server.result(timeout=10)
    assert reply == {"type": "spec", "env": {"HF_TOKEN": SPEC_MARKER}}
    assert (served.proven, served.error) == (2, None)
    assert [m["type"] for m in served.received] == ["auth", "hello"] and "token" not in served.received[1]


def test_loopback_a_client_pinning_another_certificate_says_nothing(identity):
    with _listen() as listener:
        server = _in_thread(_serve, listener, identity.server_context(), _server_handshake(identity, KEY, pod=False))
        with pytest.raises(ChannelError, match="pinned"):
            _client(_address(listener), KEY, pin="00" * 32)
        served = server.result(timeout=10)
    assert served.received == [] and served.proven is None


def test_loopback_head_mode_a_wrong_key_gets_nothing(identity):
    with _listen() as listener:
        server = _in_thread(_serve, listener, identity.server_context(), _server_handshake(identity, KEY, pod=False))
        with pytest.raises(ChannelError):  # closed without a word
            _client(_address(listener), OTHER_KEY, pin=identity.fingerprint)
        served = server.result(timeout=10)
    assert (served.proven, served.error) == (None, "hello refused")


class _FakeServer:
    """A server without the job's secret: it answers auth as best it can and keeps whatever it is sent."""

    def __init__(self, answer):
        self.answer = answer

    def on_auth(self, msg):
        return self.answer

    def check_hello(self, msg):
        return False


@pytest.mark.parametrize("answer", [
    message(Kind.CHALLENGE, server_nonce="11" * 32),  # no proof: plays head mode
    message(Kind.CHALLENGE, server_nonce="11" * 32, server_proof="22" * 32),  # a made-up proof
    None,  # a real server's machine with a guessed key
], ids=["no-proof", "made-up-proof", "guessed-key"])
def test_loopback_pod_mode_a_fake_server_learns_nothing(identity, answer):
    handshake = _FakeServer(answer) if answer else _server_handshake(identity, OTHER_KEY, pod=True)
    with _listen() as listener:
        server = _in_thread(_serve, listener, identity.server_context(), handshake)
        with pytest.raises(ChannelError, match="could not prove"):
            _client(_address(listener), KEY)
        served = server.result(timeout=10)
    [auth] = served.received  # nonce and node rank, nothing derived from the key
    assert set(auth) == {"type", "client_nonce", "node_rank"}


def _relay(listener, identity, upstream):
    """A man in the middle with a certificate of its own, passing messages both ways (two rounds)."""
    passed = []
    try:
        accepted, _ = listener.accept()
        accepted.settimeout(5)
        with identity.server_context().wrap_socket(accepted, server_side=True) as down, _tls_client(upstream) as up:
            from_client, from_server = channel.FrameReader(), channel.FrameReader()
            for _ in range(2):
                passed.append(channel.recv(down, from_client, timeout=5))
                channel.send(up, passed[-1])
                channel.send(down, channel.recv(up, from_server, timeout=5))
    except (ChannelError, OSError):
        pass
    return passed


@pytest.mark.parametrize("pod", [False, True], ids=["head-pinned", "pod"])
def test_loopback_a_man_in_the_middle_gets_nowhere(identity, pod):
    """The client saw the middleman's certificate: pod mode, the server's proof does not match it (the client
    hangs up after its auth); head mode, it is not the pinned one (the client says nothing at all). That a proof
    made through a middleman is worthless at the server anyway: the pure test of the handshake machines above."""
    middleman = tls_server.ServerIdentity.mint()
    with _listen() as real, _listen() as fake:
        server = _in_thread(_serve, real, identity.server_context(), _server_handshake(identity, KEY, pod=pod))
        relay = _in_thread(_relay, fake, middleman, _address(real))
        with pytest.raises(ChannelError):
            _client(_address(fake), KEY, pin=None if pod else identity.fingerprint)
        served, passed = server.result(timeout=10), relay.result(timeout=10)
    assert served.proven is None
    assert [m["type"] for m in passed] == (["auth"] if pod else [])


def _record(listener, upstream):
    """A plain TCP relay that records every byte each way: (client to server, server to client)."""
    down, _ = listener.accept()
    up = socket.create_connection(upstream, timeout=5)
    recorded, other = {down: bytearray(), up: bytearray()}, {down: up, up: down}
    with down, up, selectors.DefaultSelector() as selector:
        for sock in (down, up):
            selector.register(sock, selectors.EVENT_READ)
        while selector.get_map():
            ready = selector.select(5)
            if not ready:
                break
            for key, _ in ready:
                data = key.fileobj.recv(65536)
                recorded[key.fileobj] += data
                if data:
                    other[key.fileobj].sendall(data)
                    continue
                selector.unregister(key.fileobj)
                with contextlib.suppress(OSError):
                    other[key.fileobj].shutdown(socket.SHUT_WR)
    return bytes(recorded[down]), bytes(recorded[up])


def test_loopback_nothing_readable_on_the_wire_and_a_recording_replays_to_nothing(identity):
    with _listen() as real, _listen() as tap:
        server = _in_thread(_serve, real, identity.server_context(), _server_handshake(identity, KEY, pod=True))
        recorder = _in_thread(_record, tap, _address(real))
        assert _client(_address(tap), KEY, 1)["env"] == {"HF_TOKEN": SPEC_MARKER}
        served, (sent, answered) = server.result(timeout=10), recorder.result(timeout=10)
    auth, hello = served.received
    secrets = [SPEC_MARKER, HELLO_MARKER, KEY.hex(), hello["proof"], auth["client_nonce"], "hello", "auth"]
    wire = sent + answered
    assert len(sent) > 200 and [s for s in secrets if s.encode() in wire] == [] and KEY not in wire
    with _listen() as again:  # the same certificate and key even: the recording is still worth nothing
        server = _in_thread(_serve, again, identity.server_context(), _server_handshake(identity, KEY, pod=True))
        with socket.create_connection(_address(again), timeout=5) as replay:
            replay.sendall(sent)
            replay.settimeout(5)
            with contextlib.suppress(OSError):
                while replay.recv(65536):
                    pass
        replayed = server.result(timeout=10)
    assert replayed.received == [] and replayed.proven is None and replayed.error


def test_loopback_recorded_messages_replayed_inside_a_fresh_connection_are_refused(identity):
    """Even someone who could read the old messages (they cannot: see above) gets nothing from them."""
    with _listen() as listener:
        server = _in_thread(_serve, listener, identity.server_context(), _server_handshake(identity, KEY, pod=False))
        _client(_address(listener), KEY, 1, pin=identity.fingerprint)
        auth, hello = server.result(timeout=10).received
    with _listen() as listener:
        server = _in_thread(_serve, listener, identity.server_context(), _server_handshake(identity, KEY, pod=False))
        with _tls_client(_address(listener)) as sock:
            channel.send(sock, auth)
            channel.recv(sock, channel.FrameReader(), timeout=5)  # a challenge with a fresh nonce
            channel.send(sock, hello)
            with pytest.raises(ChannelError, match="closed"):
                channel.recv(sock, channel.FrameReader(), timeout=5)
        served = server.result(timeout=10)
    assert (served.proven, served.error) == (None, "hello refused")


def test_loopback_a_tls12_client_is_refused(identity):
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.check_hostname, old.verify_mode = False, ssl.CERT_NONE
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with _listen() as listener:
        server = _in_thread(_serve, listener, identity.server_context(), _server_handshake(identity, KEY, pod=False))
        with socket.create_connection(_address(listener), timeout=5) as raw, pytest.raises(ssl.SSLError):
            old.wrap_socket(raw)
        served = server.result(timeout=10)
    assert served.received == [] and "TLS handshake failed" in served.error


# ---------------------------------------------------------------------------------------------------------------
# admission.py


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _admission(**limits):
    clock = _Clock()
    return Admission(PendingLimits(**limits), clock=clock), clock


def test_pending_connections_are_capped_per_source_and_in_total():
    admission, _ = _admission(total=5, per_source=2)
    assert [admission.admit("10.0.0.1") for _ in range(3)] == [True, True, False]
    assert admission.admit("10.0.0.2") and admission.admit("10.0.0.3") and admission.admit("10.0.0.3")
    assert admission.full and not admission.admit("10.0.0.4")  # total reached
    admission.release("10.0.0.1")
    assert not admission.full and admission.admit("10.0.0.1") and admission.pending == 5


def test_a_release_too_many_does_not_make_room_that_is_not_there():
    admission, _ = _admission(total=2, per_source=2)
    assert admission.admit("10.0.0.1")
    admission.release("10.0.0.1")
    admission.release("10.0.0.1")
    admission.release("10.0.0.9")
    assert admission.pending == 0 and admission.admit("10.0.0.1") and admission.admit("10.0.0.1")
    assert not admission.admit("10.0.0.1")


def test_failures_are_rate_limited_per_source_five_then_one_a_second():
    admission, clock = _admission(failure_burst=5, failures_per_second=1.0)
    for _ in range(5):
        assert admission.admit("10.0.0.1")
        admission.release("10.0.0.1")
        admission.failed("10.0.0.1")
    assert not admission.admit("10.0.0.1")  # bucket empty: refused at accept
    assert admission.admit("10.0.0.2")  # another source is not punished
    clock.now += 0.5
    assert not admission.admit("10.0.0.1")
    clock.now += 0.5
    assert admission.admit("10.0.0.1")
    admission.failed("10.0.0.1")
    assert not admission.admit("10.0.0.1")  # one more guess a second, no burst


def test_a_refilled_bucket_is_forgotten():
    admission, clock = _admission()
    admission.failed("10.0.0.1")
    clock.now += 5
    assert admission.admit("10.0.0.1") and admission._buckets == {}


def test_the_failure_table_stays_bounded(monkeypatch):
    monkeypatch.setattr("xrun.channel.admission.MAX_TRACKED", 8)
    admission, clock = _admission()
    for i in range(100):
        clock.now += 0.001
        admission.failed(f"10.0.{i}.1")
    assert len(admission._buckets) == 8 and "10.0.99.1" in admission._buckets and "10.0.0.1" not in admission._buckets


@pytest.mark.parametrize(("a", "b", "same"), [
    ("2001:db8::1", "2001:db8::ffff:1", True),  # one /64: one host can hold all of it
    ("2001:db8::1", "2001:db8:0:1::1", False),
    ("::ffff:10.0.0.1", "10.0.0.1", True),
    ("fe80::1%eth0", "fe80::2%eth1", True),
    ("10.0.0.1", "10.0.0.2", False),
])
def test_sources_count_by_address_and_ipv6_by_its_64(a, b, same):
    from xrun.channel.admission import source_key

    assert (source_key(a) == source_key(b)) is same


def test_an_ipv6_host_cannot_dodge_the_per_source_cap_by_changing_address():
    admission, _ = _admission(per_source=2)
    assert admission.admit("2001:db8::1") and admission.admit("2001:db8::2") and not admission.admit("2001:db8::3")


def test_fd_headroom_keeps_the_agents_descriptors():
    assert fd_headroom(1024, 100, keep=128) == 796
    assert fd_headroom(1024, 1000, keep=128) == 0


def test_the_pending_cap_never_exceeds_the_descriptors_left():
    assert limits_for(8) == PendingLimits(total=512, per_source=16)
    assert limits_for(8, room=796) == PendingLimits(total=512, per_source=16)  # ulimit -n 1024: the cap as is
    assert limits_for(8, room=100) == PendingLimits(total=100, per_source=16)  # a low limit: fewer strangers
    assert limits_for(2000, room=0) == PendingLimits(total=16, per_source=16)  # always room to admit a node
    room = descriptor_room(8)
    assert room is not None and 0 <= room < resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 8


SHED = r"""
import errno, resource, socket
from xrun.channel.admission import SpareFd

listener = socket.create_server(("127.0.0.1", 0))
listener.setblocking(False)
spare = SpareFd()
clients = [socket.create_connection(listener.getsockname()) for _ in range(2)]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
hog = []
try:
    while True:
        hog.append(open("/dev/null"))
except OSError as err:
    assert err.errno == errno.EMFILE
try:
    listener.accept()
except OSError as err:
    print("accept", errno.errorcode[err.errno])
print("shed", spare.shed(listener), spare.shed(listener), spare.shed(listener))
print("spare held", spare._fd is not None)
"""


def test_at_emfile_the_spare_descriptor_sheds_queued_connections():
    """A listener with a queued connection stays readable: without a spare, a selector loop at EMFILE spins."""
    out = subprocess.run([sys.executable, "-c", SHED], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.splitlines() == ["accept EMFILE", "shed True True False", "spare held True"]
