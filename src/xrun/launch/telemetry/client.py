"""Ask ranks' endpoints (torch's worker server on a Unix socket, xrun.launch.telemetry.site) questions, all at
once, against one deadline.

``ask(questions, timeout)`` sends each question, ``POST /handler/<handler>`` (HTTP/1.0: the server closes after
its answer), to its socket from one thread with one selector, and returns each one's ``Reply``: the body,
or why there is none (no socket: the rank has not imported torch.distributed yet, telemetry could not start in
it, or the rank took it away at its exit; a socket nobody listens on: the rank died without its exit path; no
answer in time; an HTTP error). A rank that does not answer costs the deadline, never more; nothing
is retried. Standard library only.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

MAX_BODY = 64 << 20  # a Flight Recorder dump of 1,000 entries is ~0.5 MB; a user's 100,000-entry buffer ~50 MB
K = TypeVar("K", bound=Hashable)
NO_ENDPOINT = "no endpoint (the rank has not imported torch.distributed, or its torch has no worker server)"
# the socket's name is there and nobody listens: the rank served it and ended without its exit path (which takes
# the name away and leaves its records, xrun.launch.telemetry.site)
ENDPOINT_GONE = "the rank's endpoint is gone: it ended without leaving its records (killed by a signal, os._exit)"


@dataclass(frozen=True)
class Reply:
    body: bytes | None  # the answer's body (HTTP 200)
    error: str | None = None  # why there is no body
    timed_out: bool = False  # no answer within the deadline (the rank may still be working on it)
    absent: bool = False  # no socket by that name: never served, or taken away at the rank's exit


class _Exchange:
    """One request on one socket: written, then read to the server's close."""

    def __init__(self, sock: socket.socket, request: bytes) -> None:
        self.sock = sock
        self.out = request
        self.received = bytearray()

    def reply(self) -> Reply:
        if not self.received:  # a rank that ends (or dies) while asked closes its socket unanswered
            return Reply(None, "the endpoint closed the connection without an answer (the rank was ending?)")
        head, sep, body = bytes(self.received).partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or not status[0].startswith(b"HTTP/"):
            return Reply(None, "the endpoint's answer is not HTTP")
        if not sep:
            return Reply(None, f"the endpoint closed the connection after {len(self.received)} bytes of its answer "
                               "(the rank was ending?)")
        if status[1] != b"200":
            return Reply(None, f"the endpoint answered HTTP {status[1].decode('ascii', 'replace')}: "
                               f"{body[:200].decode('utf-8', 'replace')}")
        return Reply(body)


def ask(questions: Mapping[K, tuple[str, str]], timeout: float) -> dict[K, Reply]:
    """The answer to each question, ``(socket path, handler)`` (``fr_trace_json``, ``dump_traceback``), within
    ``timeout`` seconds."""
    replies: dict[K, Reply] = {}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for key, (path, handler) in questions.items():
            exchange = _connect(path, _request(handler))
            if isinstance(exchange, Reply):
                replies[key] = exchange
            else:
                sel.register(exchange.sock, selectors.EVENT_WRITE, (key, exchange))
        while sel.get_map():
            left = deadline - time.monotonic()
            events = sel.select(left) if left > 0 else []
            if not events:
                break
            for selected, _ in events:
                key, exchange = selected.data
                done = _step(sel, exchange)
                if done is not None:
                    sel.unregister(exchange.sock)
                    exchange.sock.close()
                    replies[key] = done
        for selected in list(sel.get_map().values()):
            key, exchange = selected.data
            sel.unregister(exchange.sock)
            exchange.sock.close()
            replies[key] = Reply(None, f"no answer within {timeout:g} s", timed_out=True)
    return replies


def _request(handler: str) -> bytes:
    return (f"POST /handler/{handler} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n").encode("ascii")


def _connect(path: str, request: bytes) -> _Exchange | Reply:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(path)
    except FileNotFoundError:
        sock.close()
        return Reply(None, NO_ENDPOINT, absent=True)
    except ConnectionRefusedError:
        sock.close()
        return Reply(None, ENDPOINT_GONE)
    except BlockingIOError:  # the listen backlog is full: wait for it to take us
        pass
    except OSError as err:
        sock.close()
        return Reply(None, f"cannot reach the endpoint: {err.strerror or err}")
    return _Exchange(sock, request)


def _step(sel: selectors.BaseSelector, exchange: _Exchange) -> Reply | None:
    """Write what is left of the request, then read; the reply once the server has closed."""
    sock = exchange.sock
    try:
        if exchange.out:
            sent = sock.send(exchange.out)
            exchange.out = exchange.out[sent:]
            if not exchange.out:
                sel.modify(sock, selectors.EVENT_READ, sel.get_key(sock).data)
            return None
        chunk = sock.recv(1 << 20)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as err:
        if err.errno == errno.ENOTCONN:  # the backlog's connect has not gone through yet
            return None
        return Reply(None, f"the endpoint's connection failed: {err.strerror or err}")
    if not chunk:
        return exchange.reply()
    exchange.received += chunk
    if len(exchange.received) > MAX_BODY:
        return Reply(None, f"the endpoint's answer is larger than {MAX_BODY >> 20} MiB")
    return None
