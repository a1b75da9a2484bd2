"""Which connections a server takes in before they have proven anything: bounded, and no guessing spree.

A connection is *pending* from ``accept`` until its hello proves it (or it is dropped, or ``HELLO_TIMEOUT``
passes). ``Admission`` keeps, per source address (an IPv6 source counts by its /64: one host owns a whole /64):

* a cap on pending connections, in total and per source (``PendingLimits``): a flood from one address costs
  at most ``per_source`` sockets and buffers, a flood from many at most ``total``;
* a token bucket of failures: a source may fail ``failure_burst`` proofs at once, then one per
  ``1 / failures_per_second`` s; while its bucket is empty its new connections are refused at ``accept``. A
  4-digit secret that took 1.2 s to guess at 6,000 tries a second takes hours at one try a second.

How a server uses it (selector loop)::

    sock, (ip, _) = listener.accept()          # on EMFILE: spare.shed(listener), see SpareFd
    if not admission.admit(ip): sock.close()    # refused: not a byte read, not a byte sent
    ...                                         # a failed proof or bad frame: admission.failed(ip)
    admission.release(ip)                       # once it proved itself, or was dropped, or timed out
    while admission.full: stop selecting the listener (the kernel's backlog holds the rest); resume on release

Descriptors: in pod mode node 0's agent lives in the server's process and needs descriptors of its own
(ranks' pipes, logs); ``fd_headroom`` says how many pending connections fit under ``RLIMIT_NOFILE`` while
keeping those. ``SpareFd`` is the classic answer to ``EMFILE`` at ``accept``: a listener with a queued
connection stays readable, so a loop that cannot accept spins a core; holding one spare descriptor lets the
server accept that connection and close it at once.

Pure except ``SpareFd`` (which owns one descriptor); the clock is injected.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

MAX_TRACKED = 4096  # failure buckets kept at most: memory stays bounded whatever the number of sources


@dataclass(frozen=True)
class PendingLimits:
    total: int = 256  # pending connections, all sources together
    per_source: int = 16  # ... from one source (a node runs one agent; tests on loopback may need more)
    failure_burst: int = 5
    failures_per_second: float = 1.0


def source_key(ip: str) -> str:
    """The address a limit counts by: IPv4 as is (also when IPv4-mapped), IPv6 by its /64 network."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return ip  # a Unix socket's path, say: counted as itself
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def fd_headroom(soft_limit: int, in_use: int, *, keep: int) -> int:
    """How many more descriptors a server may spend on pending connections, keeping ``keep`` for the rest."""
    return max(0, soft_limit - in_use - keep)


class Admission:
    """Pending connections and failed proofs, per source (see the module doc)."""

    def __init__(self, limits: PendingLimits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._pending: Counter[str] = Counter()
        self._total = 0
        self._buckets: dict[str, tuple[float, float]] = {}  # source -> (tokens, when they were counted)

    def admit(self, ip: str) -> bool:
        """Take in one more pending connection from ``ip``? If so it counts until ``release(ip)``."""
        key = source_key(ip)
        if self.full or self._pending[key] >= self.limits.per_source or not self._may_fail(key):
            return False
        self._pending[key] += 1
        self._total += 1
        return True

    def release(self, ip: str) -> None:
        """A pending connection from ``ip`` is over (proven, dropped or timed out)."""
        key = source_key(ip)
        if key not in self._pending:
            return  # released twice: the count must not go below what is really pending
        self._total -= 1
        self._pending[key] -= 1
        if not self._pending[key]:
            del self._pending[key]

    def failed(self, ip: str) -> None:
        """A connection from ``ip`` failed its proof (or sent garbage): spend one of the source's tokens."""
        key = source_key(ip)
        tokens = self._tokens(key) - 1.0
        if key not in self._buckets and len(self._buckets) >= MAX_TRACKED:
            self._forget_one()
        self._buckets[key] = (tokens, self._clock())

    @property
    def pending(self) -> int:
        return self._total

    @property
    def full(self) -> bool:
        return self._total >= self.limits.total

    def _may_fail(self, key: str) -> bool:
        return self._tokens(key) >= 1.0

    def _tokens(self, key: str) -> float:
        """The source's tokens now; a bucket that has refilled is forgotten (it equals no bucket at all)."""
        if key not in self._buckets:
            return float(self.limits.failure_burst)
        tokens, since = self._buckets[key]
        burst = float(self.limits.failure_burst)
        tokens = min(burst, tokens + (self._clock() - since) * self.limits.failures_per_second)
        if tokens >= burst:
            del self._buckets[key]
        return tokens

    def _forget_one(self) -> None:
        """At ``MAX_TRACKED`` sources: forget the one that failed longest ago (it is the closest to refilled)."""
        oldest = min(self._buckets, key=lambda key: self._buckets[key][1])
        del self._buckets[oldest]


class SpareFd:
    """One descriptor held back for ``EMFILE`` at ``accept`` (see the module doc)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.reserve()

    def reserve(self) -> bool:
        """Hold the spare again; False when even that fails (the process is at its limit)."""
        if self._fd is None:
            try:
                self._fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return False
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def shed(self, listener: socket.socket) -> bool:
        """At ``EMFILE``: free the spare, accept one queued connection and close it, take the spare back.

        True when a connection was shed (the listener may go quiet); False when there was nothing to shed or
        no spare to free (then stop selecting the listener for a moment, or the loop spins).
        """
        if self._fd is None:
            return False
        self.release()
        try:
            conn, _ = listener.accept()
        except OSError:  # nothing queued after all, or still EMFILE: another thread took the freed descriptor
            self.reserve()
            return False
        conn.close()
        self.reserve()
        return True
