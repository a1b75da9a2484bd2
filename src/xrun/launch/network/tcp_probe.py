"""The TCP probe between two nodes: the client that measures a peer, and the server's two halves it talks to
(issue 24).

A connection to a node's probe server (``probe_server``) starts with one mode byte: ``E`` echo (every byte comes
back: ``echo``, round trips) or ``S`` sink (count what arrives until the client's half-close, then answer the count
as 8 bytes: ``sink``, throughput measured end to end, so bytes still queued in a send buffer are never counted as
delivered). Stdlib sockets only: torch only in the all-reduce worker.
"""

from __future__ import annotations

import socket
import statistics
import struct
import time
from dataclasses import dataclass

from xrun.common.network.probe_terms import CONNECT_TIMEOUT, SECONDS

ECHO = b"E"
SINK = b"S"
CHUNK = 256 * 1024
PING = b"x" * 32
MAX_BYTES = 256 << 20  # throughput: send for SECONDS, or this much


@dataclass(frozen=True)
class Measurement:
    """One client's figures against one server; ``error`` set (and figures None) when it failed."""

    ok: bool
    latency_ms: float | None = None  # median round trip of small messages
    throughput_mbs: float | None = None  # MB/s (10^6 bytes) delivered and acknowledged
    error: str = ""
    allreduce_mbs: float | None = None  # --network=allreduce: the pair's all-reduce bandwidth (``allreduce_pair``)


def echo(conn: socket.socket) -> None:
    """The server's side of ``E`` (the mode byte already read): every byte back, until the client closes."""
    while data := conn.recv(4096):
        conn.sendall(data)


def sink(conn: socket.socket) -> None:
    """The server's side of ``S``: count what arrives until the client's half-close, then answer the count."""
    total = 0
    while data := conn.recv(CHUNK):
        total += len(data)
    conn.sendall(struct.pack("!Q", total))


def _connect(address: str, port: int, timeout: float, mode: bytes) -> socket.socket:
    sock = socket.create_connection((address, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(mode)
    return sock


def round_trips(address: str, port: int, *, count: int = 5, timeout: float = CONNECT_TIMEOUT) -> float:
    """Median round trip (ms) of ``count`` small messages on one connection."""
    with _connect(address, port, timeout, ECHO) as sock:
        times = []
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(PING)
            got = 0
            while got < len(PING):
                data = sock.recv(len(PING) - got)
                if not data:
                    raise ConnectionError("the peer closed the echo connection")
                got += len(data)
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def throughput(address: str, port: int, *, seconds: float = SECONDS, timeout: float = CONNECT_TIMEOUT) -> float:
    """MB/s: send for ``seconds`` (or ``MAX_BYTES``), half-close, and wait for the server's count."""
    payload = b"\0" * CHUNK
    with _connect(address, port, timeout, SINK) as sock:
        start = time.perf_counter()
        sent = 0
        while sent < MAX_BYTES and time.perf_counter() - start < seconds:
            sock.sendall(payload)
            sent += len(payload)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(timeout + seconds)  # what is still queued must arrive: a slow link takes longer
        answer = b""
        while len(answer) < 8:
            data = sock.recv(8 - len(answer))
            if not data:
                raise ConnectionError("the peer closed before acknowledging")
            answer += data
        elapsed = time.perf_counter() - start
    received: int = struct.unpack("!Q", answer)[0]
    return received / elapsed / 1e6


def measure(address: str, port: int, *, seconds: float = SECONDS, timeout: float = CONNECT_TIMEOUT) -> Measurement:
    """Latency then throughput against a peer's server; any failure becomes data with a one-line reason."""
    try:
        latency = round_trips(address, port, timeout=timeout)
        rate = throughput(address, port, seconds=seconds, timeout=timeout)
    except (OSError, ConnectionError) as err:
        return Measurement(ok=False, error=describe(err, address, port))
    return Measurement(ok=True, latency_ms=latency, throughput_mbs=rate)


def reach(address: str, port: int, *, timeout: float = CONNECT_TIMEOUT) -> Measurement:
    """Can this node open a connection to the peer and get a byte back? (deciding which side of a pair is bad)"""
    try:
        latency = round_trips(address, port, count=1, timeout=timeout)
    except (OSError, ConnectionError) as err:
        return Measurement(ok=False, error=describe(err, address, port))
    return Measurement(ok=True, latency_ms=latency)


def describe(err: BaseException, address: str, port: int) -> str:
    where = f"{address}:{port}"
    if isinstance(err, (socket.timeout, TimeoutError)):
        return f"timed out on {where}"
    if isinstance(err, ConnectionRefusedError):
        return f"connection to {where} refused"
    if isinstance(err, OSError) and err.strerror:
        return f"{where}: {err.strerror}"
    return f"{where}: {err}"
