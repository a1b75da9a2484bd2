"""``python -m xrun.launch.network [--toward HOST]``: one probe process per node, driven by JSON lines.

It starts a probe server, then prints one line::

    {"ready": true, "host": "node2", "address": "10.77.0.12", "port": 40123, "interface": "xceth0",
     "interfaces": ["lo", "xceth0"], "loopback_name": null, "torch": true, "gpus": 0}

``address``/``interface``: this node's address and interface on the route to ``--toward`` (the job's master;
on the master itself, the interface holding its address), which is where the job's ranks would talk.
Then each stdin line is a command, answered by one stdout line, in order::

    {"probe": "10.77.0.11:40555", "mode": "measure", "seconds": 0.5}
    -> {"ok": true, "latency_ms": 0.08, "throughput_mbs": 812.4, "error": ""}

``mode`` ``reach`` only connects and gets one byte back; ``allreduce`` runs the pair's all-reduce
(``allreduce_pair``). The hello and the answers are ``probe_commands``'s, the server ``probe_server``'s. End of
input (or ``{"quit": true}``) ends it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

from xrun.launch.network.probe_commands import hello, safe_answer
from xrun.launch.network.probe_server import ProbeServer


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
            except ValueError:
                command = {}
            if isinstance(command, dict) and command.get("quit"):
                break
            result = safe_answer(command if isinstance(command, dict) else {}, line)
            print(json.dumps(asdict(result)), flush=True)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
