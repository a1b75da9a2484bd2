"""``xrun check [-H HOSTFILE] [filters]``: preflight every host in parallel before a long job.

``--network`` measures the links between the hosts instead (pairwise rounds: xrun.runner.network, issue 24).

Without a hostfile it checks this machine (its local slots, as ``xrun`` without ``-H`` would use them), by
running the probe directly: no ssh (issue 13).

For each selected host (the probe: ``python -m xrun.launch.check_probe`` with the job's interpreter, as the network
check runs ``python -m xrun.launch.network``): reachable over ssh?, the interpreter (``--python``, default this
one's path) and its version, xrun's version, torch's version (read from package metadata, not imported, so a slow
import does not hold the others up), accelerators found vs slots asked, each GPU's name, memory and driver
(nvidia-smi), and on the master (node 0) whether ``--master_port`` (default 29500) is free. Exit 0 only when
everything is reachable and consistent (same Python and torch everywhere, the runner's xrun version everywhere,
enough accelerators, a given master port free), else 1. A busy default port is only noted: a job without
``--master_port`` takes a free one (issue 17).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from xrun import __version__
from xrun.argsplit import refuse_bare_separator, spellings, takes_values, unknown_flag
from xrun.common.spec import DEFAULT_MASTER_PORT
from xrun.errors import UsageError, XrunError
from xrun.hostlist import address_problem
from xrun.printable import columns, one_line
from xrun.runner.hosts.hostfile import read_hostfile
from xrun.runner.hosts.selection import Selection, select
from xrun.runner.hosts.this_machine import local_pool
from xrun.runner.network.check_command import check_hosts, check_mode, run_network_check
from xrun.runner.remote_options import SshSettings, add_remote_flags, openssh_args, ssh_settings
from xrun.runner.ssh_connections import Connected, close_all, connect_all, openssh_unless_paramiko
from xrun.shell import render
from xrun.strict_numbers import MAX_HOSTS, MAX_SLOTS_PER_HOST, int_arg, port_arg

PROBE_TIMEOUT = 30.0

# Runs on every node with the job's interpreter and prints one JSON object (its doc has the fields).
PROBE_MODULE = "xrun.launch.check_probe"


@dataclass
class HostReport:
    host: str
    slots: tuple[int, ...]
    reachable: bool = False
    error: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise XrunError(f"{message}; see xrun check --help")  # main says "xrun check:" once


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="xrun check", description="Preflight: reach every host and compare what it has.",
                     allow_abbrev=False)  # a flag means the same in every release
    add = parser.add_argument
    add("-H", "--hostfile", metavar="PATH",
        help="hostfile with lines 'HOST slots=N' (default: this machine, checked without ssh)")
    add("-i", "--include", metavar="SPEC", help="keep only these hosts/slots")
    add("-e", "--exclude", metavar="SPEC", help="drop these hosts/slots")
    add(*spellings("--num_nodes"), type=int_arg(high=MAX_HOSTS), metavar="N", help="use the first N hosts")
    add(*spellings("--num_gpus"), dest="num_gpus", type=int_arg(high=MAX_SLOTS_PER_HOST),
        metavar="N", help="use slots 0..N-1 of every host")
    add("--python", metavar="PATH", default=sys.executable, help="interpreter the job will use (default: this one)")
    add(*spellings("--master_port"), type=port_arg, metavar="PORT",
        help=f"check that this port is free on node 0 (default {DEFAULT_MASTER_PORT}, only noted: a job without "
             "--master_port takes a free one; 0: skip)")
    add("--network", nargs="?", const="tcp", metavar="MODE",
        help="measure the links between the hosts instead, in pairwise rounds (latency, throughput), and name "
             "every slow or unreachable node; exit 1 if any. Slow: best throughput < 0.5 x the median of the "
             "nodes' bests, or best latency > 2 x the median + 5 ms. MODE: tcp (default) or allreduce (also a "
             "torch all-reduce per pair, gloo or nccl; slow below 0.5 x the median too); docs/network-check.md")
    add("--json", action="store_true", help="with --network: print one JSON object with every node")
    add_remote_flags(parser, job=False)
    return parser


def probe_argv(python: str, master_port: int, master: str) -> list[str]:
    return [python, "-m", PROBE_MODULE, str(master_port), master]


def run_probes(hosts: Sequence[str], ns: argparse.Namespace) -> dict[str, tuple[bool, str, str]]:
    """host -> (reachable, stdout, error): native ssh when paramiko is installed, else OpenSSH's client."""
    commands = {h: render(probe_argv(ns.python, ns.master_port if i == 0 else 0, hosts[0]))
                for i, h in enumerate(hosts)}
    settings = ssh_settings(ns)
    ssh = openssh_unless_paramiko()
    return _probe_paramiko(commands, settings) if ssh is None else _probe_openssh(ssh, commands, settings)


def probe_here(host: str, ns: argparse.Namespace) -> Probes:
    """This machine: the probe as a child process, no ssh."""
    try:
        done = subprocess.run(probe_argv(ns.python, ns.master_port, host), capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {host: (True, "", f"cannot run {ns.python}: {err}")}
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    return {host: (True, done.stdout, last)}


def _probe_paramiko(commands: dict[str, str], settings: SshSettings) -> dict[str, tuple[bool, str, str]]:
    results = connect_all(list(commands), settings)
    try:
        def one(result: Any) -> tuple[str, tuple[bool, str, str]]:
            if not isinstance(result, Connected):
                return result.host, (False, "", result.reason)
            try:
                _, out, err = result.client.exec_command(commands[result.host], timeout=PROBE_TIMEOUT)
                stdout, stderr = out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")
            except Exception as exc:  # noqa: BLE001 - becomes a row of the table
                return result.host, (True, "", f"probe failed: {exc}")
            return result.host, (True, stdout, stderr.strip().splitlines()[-1] if stderr.strip() else "")

        with ThreadPoolExecutor(max_workers=min(64, len(results) or 1)) as pool:
            return dict(pool.map(one, results))
    finally:
        close_all(results)


def _probe_openssh(ssh: str, commands: dict[str, str], settings: SshSettings) -> dict[str, tuple[bool, str, str]]:
    base = [ssh, *openssh_args(settings)]

    def one(host: str) -> tuple[str, tuple[bool, str, str]]:
        try:
            done = subprocess.run([*base, "--", host, commands[host]], capture_output=True, text=True,
                                  timeout=PROBE_TIMEOUT, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return host, (False, "", f"no answer within {PROBE_TIMEOUT:g} s")
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        return host, (done.returncode != 255, done.stdout, last)

    with ThreadPoolExecutor(max_workers=min(64, len(commands) or 1)) as pool:
        return dict(pool.map(one, commands))


Probes = dict[str, tuple[bool, str, str]]  # host -> (reachable, probe stdout, error)


def assess(world: dict[str, tuple[int, ...]], probes: Probes, master_port: int) -> list[HostReport]:
    """Pure: one report per host, with the problems that make the cluster inconsistent."""
    reports = []
    for host, slots in world.items():
        report = HostReport(host, slots)
        reachable, stdout, error = probes[host]
        report.reachable = reachable
        try:
            report.facts = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
        except ValueError:
            report.facts = {}
        if not reachable:
            report.problems.append(f"unreachable: {error}")
        elif not report.facts:
            # the probe is xrun's own module: an interpreter without xrun (or with one older than the probe)
            # cannot run it, which is the same advice as a version that differs
            missing = f"; install xrun {__version__} there" if "No module named" in error else ""
            report.problems.append(f"the probe did not run: {error or 'no output'}{missing}")
        reports.append(report)
    ok = [r for r in reports if r.facts]
    for key, what in (("version", "Python"), ("torch", "torch")):
        values = {r.facts.get(key) for r in ok}
        if len(values) > 1:
            for r in ok:
                r.problems.append(f"{what} {r.facts.get(key)} differs from other hosts")
    for r in ok:
        if r.facts.get("xrun") != __version__:
            here = r.facts.get("xrun")
            r.problems.append(f"xrun {here} here, {__version__} on the head: install the same everywhere")
        count = int(r.facts.get("accelerators") or 0)
        if count and max(r.slots) >= count:
            r.problems.append(f"slots {','.join(map(str, r.slots))} but only {count} accelerator(s)")
    if reports and reports[0].facts and master_port and reports[0].facts.get("port_free") is False:
        reports[0].problems.append(f"master port {master_port} is in use on {reports[0].host}")
    return reports


def format_host_table(reports: list[HostReport], master_port: int, *, given: bool = True) -> str:
    header = ("host", "reachable", "interface", "python", "version", "xrun", "torch", "accel/slots", "gpus",
              "problems")
    rows: list[tuple[str, ...]] = [header]
    for r in reports:
        f = r.facts
        count = f.get("accelerators")
        accel = f"{count}/{len(r.slots)}" + (" (cpu)" if count == 0 else "") if f else "-"
        rows.append((r.host, "yes" if r.reachable else "NO", str(f.get("interface") or "-"), str(f.get("python", "-")),
                     str(f.get("version", "-")), str(f.get("xrun") or "-"), str(f.get("torch") or "-"), accel,
                     gpu_summary(f.get("gpus")), "; ".join(r.problems) or "ok"))
    # a host's answers are its own strings: control characters shown escaped (issue 22 §6)
    lines = [one_line(line) for line in columns(rows)]
    if reports and master_port:
        free = reports[0].facts.get("port_free")
        state = "free" if free else "IN USE" if free is False else "unknown"
        note = " (no --master_port: a free one will be used)" if free is False and not given else ""
        lines.append(f"master {reports[0].host}: port {master_port} {state}{note}")
    return "\n".join(lines)


def gpu_summary(gpus: Any) -> str:
    """A host's GPUs as the probe read them: ``8x NVIDIA H100 80GB HBM3 81559 MiB, driver 580.159.04``."""
    if not isinstance(gpus, list) or not gpus:
        return "-"
    kinds: dict[tuple[str, str], int] = {}
    for gpu in gpus:
        if isinstance(gpu, dict):
            key = (f"{gpu.get('name')} {gpu.get('memory_mib')} MiB", str(gpu.get("driver")))
            kinds[key] = kinds.get(key, 0) + 1
    return "; ".join(f"{count}x {what}, driver {driver}" for (what, driver), count in kinds.items()) or "-"


def _check_ports(ns: argparse.Namespace) -> None:
    """Before any host is probed: a port or an address that cannot be one, an empty interpreter, are usage errors
    (exit 2, as xrun's own flags), not rows of the table."""
    if not 0 <= ns.master_port <= 65535:
        raise UsageError("--master_port", f"{ns.master_port} is not a TCP port (0..65535; 0 skips the check)")
    problem = address_problem(ns.control_addr) if ns.control_addr is not None else None
    if problem:
        raise UsageError("--control_addr", problem)
    if not ns.python.strip():
        raise UsageError("--python", "is empty; name the interpreter the job will use")
    ssh_settings(ns)  # --ssh_port


def parse_check_args(argv: Sequence[str]) -> argparse.Namespace:
    """The flags; one it does not have is named with the closest it has (check runs no script)."""
    parser = build_parser()
    takes_value = takes_values(parser)
    for word in argv:
        refuse_bare_separator(word, takes_value)
    ns, extra = parser.parse_known_args(list(argv))
    flags = [index for index, word in enumerate(extra) if word.startswith("-") and word != "-"]
    if flags:
        raise unknown_flag(parser, extra, flags[0], has_script=False)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return ns


def _check_network_flags(ns: argparse.Namespace) -> None:
    if ns.network is not None:
        check_mode(ns.network)
    elif ns.json:
        raise UsageError("--json", "only applies with --network")


def _network(hosts: list[str], ns: argparse.Namespace) -> int:
    check_hosts(hosts)
    return run_network_check(hosts, python=ns.python, settings=ssh_settings(ns), as_json=ns.json, mode=ns.network)


def main(argv: Sequence[str]) -> int:
    try:
        ns = parse_check_args(argv)
        given = ns.master_port is not None
        ns.master_port = DEFAULT_MASTER_PORT if ns.master_port is None else ns.master_port
        _check_ports(ns)
        _check_network_flags(ns)
        selection = Selection(include=ns.include, exclude=ns.exclude, num_nodes=ns.num_nodes, num_gpus=ns.num_gpus)
        pool = read_hostfile(ns.hostfile).pool() if ns.hostfile else local_pool(os.environ, selection).pool
        world = dict(select(pool, selection))
        if ns.network is not None:
            return _network(list(world), ns)
        probes = run_probes(list(world), ns) if ns.hostfile else probe_here(next(iter(world)), ns)
    except XrunError as err:
        print(f"xrun check: {one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    reports = assess(world, probes, ns.master_port if given else 0)
    print(format_host_table(reports, ns.master_port, given=given))
    bad = [r.host for r in reports if r.problems]
    if bad:
        print(f"xrun check: {len(bad)} of {len(reports)} host(s) need attention: {', '.join(bad)}", file=sys.stderr)
        return 1
    print(f"xrun check: {len(reports)} host(s) reachable and consistent")
    return 0
