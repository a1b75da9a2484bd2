"""``python -m bench.control_server NODES STATS``: xrun's real control server for ``NODES`` nodes, as a head runs it
(the plan for the whole world planned here, ``ControlServer`` listening on 127.0.0.1 behind its ``Gate``: TLS with
a fresh certificate, the run token as every node's key), with no backend behind it: the load generator
(``bench.loadgen``) plays every agent. Prints the port and the certificate's fingerprint on one line, serves until
the job is over and writes its own figures to ``STATS`` (JSON): exit code, peak RSS (VmHWM), threads, CPU seconds.

The token comes in ``XBENCH_TOKEN``. Run by the ``control_plane`` scale scenario and by the control-plane test.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any

from xrun.runner.job.control_server import ControlServer
from xrun.runner.job.gate import Gate
from xrun.runner.job.keys import NodeKeys
from xrun.runner.plan import JobRequest, Plan, make_plan


class NoSessions:
    """The ``Sessions`` of a backend that started nothing: the agents are simulated elsewhere."""

    def register(self, loop: Any) -> None:
        pass

    def finished(self, lost: set[str]) -> bool:
        return True

    def terminate(self) -> None:
        pass


def world_plan(nodes: int) -> Plan:
    """One rank per node, as the pdsh backend would plan it (a channel backend; the master agreed at the barrier)."""
    world = {f"sim{i}": (0,) for i in range(nodes)}
    return make_plan(JobRequest(script="train.py", args=("--epochs", "1"), cwd="/tmp"), world, "pdsh")


def head_server(nodes: int, token: str, *, join_timeout: float) -> ControlServer:
    """The head's control server for ``world_plan(nodes)``, every node proving ``token``'s key (ssh's way)."""
    gate = Gate(NodeKeys.shared_secret(nodes, token), nodes=nodes, prove_server=False)
    return ControlServer(world_plan(nodes), gate, join_timeout=join_timeout)


def status_field(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return -1


def main(argv: list[str]) -> int:
    nodes, stats_path = int(argv[0]), argv[1]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # as xrun.fdlimit does (older xruns did not)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = head_server(nodes, os.environ["XBENCH_TOKEN"], join_timeout=600)
    port = server.listen(["127.0.0.1"])
    print(port, server.gate.fingerprint, flush=True)
    code = server.run(NoSessions())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats = {"exit_code": code, "vmhwm_kib": status_field("VmHWM"), "threads": status_field("Threads"),
             "cpu_s": usage.ru_utime + usage.ru_stime}
    with open(stats_path, "w") as f:
        json.dump(stats, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
