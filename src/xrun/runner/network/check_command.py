"""``xrun check --network[=MODE]``: its bad input (the mode, too few hosts, no torch for ``allreduce``), and the
wiring from the selected hosts to the printed verdicts: the probes over ssh (``ssh_probes``), the check
(``coordinate``), the table or JSON (``node_results``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from xrun.errors import UsageError
from xrun.runner.network import node_results
from xrun.runner.network.coordinate import Check
from xrun.runner.network.ssh_probes import Down, Link, LinkProber, start_links
from xrun.runner.remote_options import SshSettings

TCP = "tcp"
ALLREDUCE = "allreduce"
MODES = (TCP, ALLREDUCE)


def check_mode(mode: str) -> None:
    """``--network[=MODE]``: tcp (the default) or allreduce (tcp, plus a torch all-reduce per pair)."""
    if mode not in MODES:
        raise UsageError("--network", f"unknown mode {mode!r}; known: {', '.join(MODES)}")


def check_hosts(hosts: Sequence[str]) -> None:
    if len(hosts) < 2:
        raise UsageError("--network", f"needs at least 2 hosts to pair, the selection has {len(hosts)} "
                         f"({', '.join(hosts) or 'none'}); pass -H HOSTFILE")


def check_torch(hosts: Sequence[str], hellos: Mapping[int, Mapping[str, Any]]) -> None:
    """--network=allreduce needs torch on every node that came up: bad input (exit 2) naming the nodes that lack it."""
    lacking = [hosts[i] for i, hello in sorted(hellos.items()) if not hello.get("torch")]
    if lacking:
        raise UsageError("--network=allreduce", f"needs torch on every node; not importable with --python on "
                         f"{', '.join(lacking)} (use --network for the TCP check)")


def run_network_check(hosts: Sequence[str], *, python: str, settings: SshSettings, as_json: bool,
                      mode: str = TCP) -> int:
    """Start the probes, run the rounds, print; 0 when every node is ok, 1 when any is bad."""
    start = time.monotonic()
    started = start_links(hosts, python, settings)
    links = {i: s for i, s in enumerate(started) if isinstance(s, Link)}
    down = {i: f"the probe did not start: {s.reason}" for i, s in enumerate(started) if isinstance(s, Down)}
    try:
        if mode == ALLREDUCE:
            check_torch(hosts, {i: link.hello for i, link in links.items()})
        outcome = Check(range(len(hosts)), down, allreduce=mode == ALLREDUCE).run(LinkProber(links))
    finally:
        for link in links.values():
            link.close()
    elapsed = time.monotonic() - start
    rows = node_results.node_rows(hosts, {i: link.hello for i, link in links.items()}, outcome.verdicts)
    print(node_results.format_json(rows, elapsed) if as_json else node_results.format_table(rows))
    quiet_stdout = as_json or node_results.bad(rows)  # --json: stdout holds exactly one object
    print(node_results.summary(rows, elapsed), file=sys.stderr if quiet_stdout else sys.stdout)
    return 1 if node_results.bad(rows) else 0
