"""A TCP probe between two nodes: a server that echoes or sinks, and a client that measures (issue 24).

Each connection starts with one mode byte: ``E`` echo (every byte comes back: round trips), ``S`` sink (count
what arrives until the client's half-close, then answer the count as 8 bytes: throughput measured end to end,
so bytes still queued in a send buffer are never counted as delivered), ``A`` all-reduce (start this node's rank
of a pair's torch group: ``allreduce``). Stdlib sockets only here: torch only in the all-reduce worker.
"""

from __future__ import annotations

import socket
import statistics
import struct
import threading
import time
from dataclasses import dataclass

ECHO = b"E"
SINK = b"S"
CHUNK = 256 * 1024
PING = b"x" * 32
ALLREDUCE = b"A"  # an all-reduce pair (``xrun.launch.network.allreduce``)


@dataclass(frozen=True)
class Measurement:
    """One client's figures against one server; ``error`` set (and figures None) when it failed."""

    ok: bool
    latency_ms: float | None = None  # median round trip of small messages
    throughput_mbs: float | None = None  # MB/s (10^6 bytes) delivered and acknowledged
    error: str = ""
    allreduce_mbs: float | None = None  # --network=allreduce: the pair's all-reduce bandwidth (``allreduce``)


class ProbeServer:
    """Accepts on every address of ``port`` (0: the kernel picks); one thread per connection, daemons all."""

    def __init__(self, port: int = 0, *, family: socket.AddressFamily = socket.AF_INET) -> None:
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("", port))
        self._sock.listen(128)
        self.port = int(self._sock.getsockname()[1])
        threading.Thread(target=self._accept, name="xrun-netprobe-accept", daemon=True).start()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept thread; close alone leaves it listening
        except OSError:
            pass
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=_serve, args=(conn,), name="xrun-netprobe-conn", daemon=True).start()


def _serve(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(30)  # a client that vanishes mid-probe must not hold a thread forever
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            mode = conn.recv(1)
            if mode == ECHO:
                while data := conn.recv(4096):
                    conn.sendall(data)
            elif mode == SINK:
                total = 0
                while data := conn.recv(CHUNK):
                    total += len(data)
                conn.sendall(struct.pack("!Q", total))
            elif mode == ALLREDUCE:
                conn.settimeout(None)  # the all-reduce worker is bounded by its own timeout
                from xrun.launch.network.allreduce import serve  # noqa: PLC0415 - only for --network=allreduce

                serve(conn)
        except OSError:
            return


def _connect(address: str, port: int, timeout: float, mode: bytes) -> socket.socket:
    sock = socket.create_connection((address, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(mode)
    return sock


def round_trips(address: str, port: int, *, count: int = 5, timeout: float = 3.0) -> float:
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


def throughput(address: str, port: int, *, seconds: float = 0.5, max_bytes: int = 256 << 20,
               timeout: float = 3.0) -> float:
    """MB/s: send for ``seconds`` (or ``max_bytes``), half-close, and wait for the server's count."""
    payload = b"\0" * CHUNK
    with _connect(address, port, timeout, SINK) as sock:
        start = time.perf_counter()
        sent = 0
        while sent < max_bytes and time.perf_counter() - start < seconds:
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


def measure(address: str, port: int, *, seconds: float = 0.5, timeout: float = 3.0) -> Measurement:
    """Latency then throughput against a peer's server; any failure becomes data with a one-line reason."""
    try:
        latency = round_trips(address, port, timeout=timeout)
        rate = throughput(address, port, seconds=seconds, timeout=timeout)
    except (OSError, ConnectionError) as err:
        return Measurement(ok=False, error=describe(err, address, port))
    return Measurement(ok=True, latency_ms=latency, throughput_mbs=rate)


def reach(address: str, port: int, *, timeout: float = 3.0) -> Measurement:
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
