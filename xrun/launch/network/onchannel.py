"""A node's part of a job's ``--precheck`` (issue 24): the same probes as ``xrun check --network``, on the word of
the runner over the job's control channel, while the agent waits at a start barrier (``xrun.launch.session``).

``probe_open(toward)`` opens this node's probe server and is answered ``probe_ready`` (the hello of
``commands``); each ``probe(id, probe, mode, seconds, timeout)`` runs on one worker thread, in order, and is
answered ``probed(id, ok, latency_ms, throughput_mbs, error)``: the agent's reader keeps answering pings while
a probe of a slow link takes seconds. ``close`` (the barrier opened, or the job stops) ends both.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import asdict
from typing import Any, Callable

from xrun.channel import Kind, message
from xrun.launch.network.commands import hello, safe_answer
from xrun.launch.network.probe import ProbeServer

KINDS = (Kind.PROBE_OPEN.value, Kind.PROBE.value)  # what the runner sends for the precheck


class NodeProbes:
    """``send`` is called from the worker thread too: it must be safe from any thread (``Link.send`` is)."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._send = send
        self._server: ProbeServer | None = None
        self._work: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def handle(self, msg: dict[str, Any]) -> None:
        if msg.get("type") == Kind.PROBE_OPEN.value:
            if self._server is None:
                self._server = ProbeServer()
            toward = msg.get("toward")
            self._reply(message(Kind.PROBE_READY, **hello(toward if isinstance(toward, str) else None,
                                                          self._server.port)))
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._probe_forever, name="xrun-precheck", daemon=True)
            self._thread.start()
        self._work.put(msg)

    def close(self) -> None:
        if self._thread is not None:
            self._work.put(None)
            self._thread.join(timeout=1.0)  # a probe in flight is bounded by its own timeouts; it is a daemon
        if self._server is not None:
            self._server.close()

    def _probe_forever(self) -> None:
        while (msg := self._work.get()) is not None:
            result = safe_answer(msg, str(msg.get("probe")))
            self._reply(message(Kind.PROBED, id=msg.get("id"), **asdict(result)))

    def _reply(self, msg: dict[str, Any]) -> None:
        try:
            self._send(msg)
        except OSError:
            pass  # the channel broke: the agent's reader says so and the agent ends
