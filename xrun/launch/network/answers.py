"""The node's answers to ``--precheck``'s probes on the control channel, at whichever barrier the agent waits (the
first, a spare's standby, a restart's: ``xrun.launch.session.driver``): the probe server is made, and
``xrun.launch.network.onchannel`` loaded, only when the runner first asks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ProbeAnswers:
    """``probe_open`` and ``probe`` messages handed over as they come; ``close`` ends the probe server, if any."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._send = send
        self._probes: Any = None  # xrun.launch.network.onchannel.NodeProbes, once the runner asked

    def handle(self, msg: dict[str, Any]) -> None:
        if self._probes is None:
            from xrun.launch.network.onchannel import NodeProbes  # noqa: PLC0415 - --precheck only

            self._probes = NodeProbes(self._send)
        self._probes.handle(msg)

    def close(self) -> None:
        if self._probes is not None:
            self._probes.close()
            self._probes = None
