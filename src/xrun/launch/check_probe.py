"""``python -m xrun.launch.check_probe MASTER_PORT MASTER``: what ``xrun check`` asks of every node.

Run with the job's interpreter, over ssh (or as a child process when the check is of this machine alone), as
``xrun check --network`` runs ``python -m xrun.launch.network``: one remote-probe path, a module of the node layer
rather than a program sent as a string. It prints one JSON object::

    {"hostname": "node2", "python": "/usr/bin/python3", "version": "3.12.3", "xrun": "0.9.0", "torch": "2.6.0",
     "accelerators": 8, "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "driver": "580.159.04"}],
     "port_free": true, "interface": "eth0"}

Versions are read from package metadata, never imported, so a slow ``import torch`` holds no node up; the GPUs
come from ``/proc`` and ``nvidia-smi``. ``port_free``: whether ``MASTER_PORT`` can be bound here (None for 0: the
head asks it of node 0 only); ``interface``: this node's interface on the route to ``MASTER``. The head compares
the answers (``xrun.runner.check``). Stdlib only, besides the interface choice.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from xrun.common.network.interfaces import interface_toward

SMI_TIMEOUT = 10.0


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except Exception:  # noqa: BLE001 - a package that is not there, or whose metadata is broken: no version
        return None


def accelerators() -> int:
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT).stdout
    except Exception:  # noqa: BLE001 - no nvidia-smi, or one that hangs: no accelerators
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def gpus() -> list[dict[str, Any]]:
    """Each GPU's name, memory and driver as the driver reports them (``nvidia-smi``)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=SMI_TIMEOUT).stdout
    except Exception:  # noqa: BLE001
        return []
    rows = [[f.strip() for f in line.rsplit(",", 2)] for line in out.splitlines()]
    return [{"name": r[0], "memory_mib": int(r[1]), "driver": r[2]} for r in rows if len(r) == 3 and r[1].isdigit()]


def port_free(port: int) -> bool | None:
    if port <= 0:
        return None
    with socket.socket() as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def interface(toward: str) -> str | None:
    try:
        return interface_toward(toward).interface
    except Exception:  # noqa: BLE001 - no route, no /proc: the column shows '-'
        return None


def facts(master_port: int, master: str) -> dict[str, Any]:
    return {"hostname": socket.gethostname(), "python": sys.executable, "version": sys.version.split()[0],
            "xrun": version("xrun"), "torch": version("torch"), "accelerators": accelerators(), "gpus": gpus(),
            "port_free": port_free(master_port), "interface": interface(master)}


def main(argv: Sequence[str] | None = None) -> int:
    master_port, master = sys.argv[1:] if argv is None else argv
    print(json.dumps(facts(int(master_port), master)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
