"""What a node's probes are asked, answered the same way over stdin (``xrun check --network``'s probe process,
``__main__``) and over a job's control channel (``--precheck``, ``precheck_answers``): its hello (where its probe
server listens, which interface leads to the master, torch and GPUs) and one probe command.
"""

from __future__ import annotations

import socket
from typing import Any

from xrun.common.network import interfaces
from xrun.common.network.probe_terms import BYTES, CONNECT_TIMEOUT, GROUP_TIMEOUT, SECONDS
from xrun.launch.network import allreduce_pair
from xrun.launch.network.tcp_probe import Measurement, measure, reach


def hello(toward: str | None, port: int) -> dict[str, Any]:
    """This node's probe server and its address and interface on the route to ``toward`` (the job's master)."""
    choice = interfaces.interface_toward(toward or socket.gethostname())
    return {
        "ready": True,
        "host": socket.gethostname(),
        "address": choice.source,
        "port": port,
        "interface": choice.interface,
        "interfaces": list(interfaces.interface_names()),
        "loopback_name": interfaces.hostname_is_loopback(socket.gethostname()),
        "torch": allreduce_pair.has_torch(),  # found, not imported: --network=allreduce needs it on every node
        "gpus": allreduce_pair.gpu_count(),  # nccl for a pair whose nodes both have GPUs
    }


def answer(command: dict[str, Any]) -> Measurement:
    """One probe command (``{"probe": "ADDR:PORT", "mode": "measure"|"reach"|"allreduce", "seconds", "timeout"}``;
    ``allreduce``: the pair's all-reduce with ``backend``, ``bytes``, ``iters``, ``group_timeout``)."""
    address, _, port = str(command["probe"]).rpartition(":")
    address = address.strip("[]")  # [v6]:port
    timeout = float(command.get("timeout", CONNECT_TIMEOUT))
    if command.get("mode") == "reach":
        return reach(address, int(port), timeout=timeout)
    if command.get("mode") == "allreduce":
        pair = allreduce_pair.run_pair(address, int(port), backend=str(command.get("backend", "gloo")),
                                       size=int(command.get("bytes", BYTES)),
                                       iters=int(command.get("iters", allreduce_pair.ITERS)),
                                       timeout=float(command.get("group_timeout", GROUP_TIMEOUT)),
                                       connect_timeout=timeout)
        return Measurement(ok=pair.ok, allreduce_mbs=pair.allreduce_mbs,
                           error=f"all-reduce: {pair.error}" if pair.error else "")
    return measure(address, int(port), seconds=float(command.get("seconds", SECONDS)), timeout=timeout)


def safe_answer(command: dict[str, Any], shown: str) -> Measurement:
    """``answer``, with a malformed command as a failed measurement (``shown``: the command as it came)."""
    try:
        return answer(command)
    except (ValueError, KeyError, TypeError) as err:
        return Measurement(ok=False, error=f"bad command {shown.strip()[:80]!r}: {err}")
