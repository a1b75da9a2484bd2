"""A node's part of a job's ``--precheck`` (issue 24): the same probes as ``xrun check --network``, on the word of
the runner over the job's control channel, while the agent waits at a start barrier (``xrun.launch.session``).

``probe_open(toward)`` opens this node's probe server and is answered ``probe_ready`` (the hello of
``probe_commands``); each ``probe(id, probe, mode, seconds, timeout)`` runs on one worker thread, in order, and is
answered ``probed(id, ok, latency_ms, throughput_mbs, error)``: the agent's reader keeps answering pings while
a probe of a slow link takes seconds. ``close`` (the barrier opened, or the job stops) ends both.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable

from xrun.channel import Kind, message

if TYPE_CHECKING:
    from xrun.launch.network.probe_server import ProbeServer
    from xrun.launch.network.tcp_probe import Measurement


class ProbeAnswers:
    """``probe_open`` and ``probe`` messages handed over as they come; ``send`` is called from the worker thread
    too: it must be safe from any thread (``Link.send`` is)."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._send = send
        self._server: ProbeServer | None = None
        self._work: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def handle(self, msg: dict[str, Any]) -> None:
        # Loaded here, on the runner's first word: every agent holds a ProbeAnswers, only --precheck asks it
        # anything, and the probes' modules (statistics with its decimal and fractions, the probe server, the
        # all-reduce pair) loaded at the top would add 2.4 ms (median; 4 ms at best) to the 83 ms of CPU of every
        # agent's whole life (``python -m bench agent_start``, paired runs).
        from xrun.launch.network import probe_commands, probe_server

        if msg.get("type") == Kind.PROBE_OPEN.value:
            if self._server is None:
                self._server = probe_server.ProbeServer()
            toward = msg.get("toward")
            self._reply(message(Kind.PROBE_READY, **probe_commands.hello(toward if isinstance(toward, str) else None,
                                                                         self._server.port)))
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._probe_forever, args=(probe_commands.safe_answer,),
                                            name="xrun-precheck", daemon=True)
            self._thread.start()
        self._work.put(msg)

    def close(self) -> None:
        """End the worker and the probe server; a later ``probe_open`` (the next attempt's precheck) starts both
        afresh."""
        if self._thread is not None:
            self._work.put(None)
            self._thread.join(timeout=1.0)  # a probe in flight is bounded by its own timeouts; it is a daemon
            self._thread, self._work = None, queue.SimpleQueue()
        if self._server is not None:
            self._server.close()
            self._server = None

    def _probe_forever(self, answer: Callable[[dict[str, Any], str], Measurement]) -> None:
        while (msg := self._work.get()) is not None:
            result = answer(msg, str(msg.get("probe")))
            self._reply(message(Kind.PROBED, id=msg.get("id"), **asdict(result)))

    def _reply(self, msg: dict[str, Any]) -> None:
        try:
            self._send(msg)
        except OSError:
            pass  # the channel broke: the agent's reader says so and the agent ends
