"""``python -m xrun.launch.network [--toward HOST]``: one probe process per node, driven by JSON lines.

It starts a probe server, then prints one line::

    {"ready": true, "host": "node2", "address": "10.77.0.12", "port": 40123, "interface": "xceth0",
     "interfaces": ["lo", "xceth0"], "loopback_name": null}

``address``/``interface``: this node's address and interface on the route to ``--toward`` (the job's master;
on the master itself, the interface holding its address), which is where the job's ranks would talk.
Then each stdin line is a command, answered by one stdout line, in order::

    {"probe": "10.77.0.11:40555", "mode": "measure", "seconds": 0.5}
    -> {"ok": true, "latency_ms": 0.08, "throughput_mbs": 812.4, "error": ""}

``mode`` ``reach`` only connects and gets one byte back. End of input (or ``{"quit": true}``) ends it.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from xrun.launch.network import interfaces
from xrun.launch.network.probe import Measurement, ProbeServer, measure, reach


def hello(toward: str | None, port: int) -> dict[str, Any]:
    choice = interfaces.interface_toward(toward or socket.gethostname())
    return {
        "ready": True,
        "host": socket.gethostname(),
        "address": choice.source,
        "port": port,
        "interface": choice.interface,
        "interfaces": list(interfaces.interface_names()),
        "loopback_name": interfaces.hostname_is_loopback(socket.gethostname()),
    }


def answer(command: dict[str, Any]) -> Measurement:
    address, _, port = str(command["probe"]).rpartition(":")
    address = address.strip("[]")  # [v6]:port
    timeout = float(command.get("timeout", 3.0))
    if command.get("mode") == "reach":
        return reach(address, int(port), timeout=timeout)
    return measure(address, int(port), seconds=float(command.get("seconds", 0.5)), timeout=timeout)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xrun.launch.network", description=__doc__.split("\n")[0])
    parser.add_argument("--toward", metavar="HOST", help="the master: report the interface on the route to it")
    parser.add_argument("--port", type=int, default=0, help="the probe server's port (default: a free one)")
    ns = parser.parse_args(argv)
    server = ProbeServer(ns.port)
    try:
        print(json.dumps(hello(ns.toward, server.port)), flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                command = json.loads(line)
                if command.get("quit"):
                    break
                result = answer(command)
            except (ValueError, KeyError, TypeError) as err:
                result = Measurement(ok=False, error=f"bad command {line.strip()[:80]!r}: {err}")
            print(json.dumps(asdict(result)), flush=True)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
