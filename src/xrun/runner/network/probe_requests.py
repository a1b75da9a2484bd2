"""One probe request as its node is asked it, its time budget, and the answer back as a ``Probe``: the same for the
probe processes over ssh (``ssh_probes``) and for a job's agents over its control channel (``precheck_channel``).

A request ``src -> dst`` goes to ``src`` as ``{"probe": "ADDR:PORT", "mode", "seconds", "timeout"}`` (``dst``'s
probe server, from its hello), and for ``--network=allreduce`` with the pair's backend, the group's bound and the
tensor's size too; the node answers it with ``xrun.launch.network.probe_commands``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xrun.common.network.probe_terms import CONNECT_TIMEOUT, GROUP_TIMEOUT, SECONDS, backend_for, size_for
from xrun.runner.network.coordinate import ALLREDUCE, REACH, Request
from xrun.runner.network.node_verdicts import Probe


def _seconds(request: Request) -> float:
    return 0.0 if request.mode == REACH else SECONDS  # reach only connects: nothing to send for a while


def command_for(request: Request, src: Mapping[str, Any], dst: Mapping[str, Any]) -> dict[str, Any]:
    """What ``request.src`` is sent; ``src`` and ``dst`` are the two nodes' hellos (address, port, GPUs)."""
    address = str(dst["address"])
    target = f"[{address}]:{dst['port']}" if ":" in address else f"{address}:{dst['port']}"
    command: dict[str, Any] = {"probe": target, "mode": request.mode, "seconds": _seconds(request),
                               "timeout": CONNECT_TIMEOUT}
    if request.mode == ALLREDUCE:
        command.update(backend=backend_for(int(src.get("gpus") or 0), int(dst.get("gpus") or 0)),
                       group_timeout=GROUP_TIMEOUT, bytes=size_for(request.rate_mbs))
    return command


def probe_budget(request: Request) -> float:
    """How long one probe may take before it counts as failed: its connections' timeouts and its sending time; an
    all-reduce's ranks may each take twice the group's bound before they are killed."""
    budget = 4 * CONNECT_TIMEOUT + 2 * _seconds(request) + 5
    return budget + 4 * GROUP_TIMEOUT if request.mode == ALLREDUCE else budget


def probe_from(request: Request, answer: Mapping[str, Any]) -> Probe:
    """The node's answer to ``request`` as its ``Probe`` (a figure that is not a number counts as missing)."""
    return Probe(request.src, request.dst, ok=bool(answer.get("ok")), latency_ms=_number(answer.get("latency_ms")),
                 throughput_mbs=_number(answer.get("throughput_mbs")), error=str(answer.get("error") or ""),
                 allreduce_mbs=_number(answer.get("allreduce_mbs")))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None
