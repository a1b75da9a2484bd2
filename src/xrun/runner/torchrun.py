"""torchrun's command line, accepted with its meaning (issue 41): swap the word ``torchrun`` for ``xrun``.

Every flag of torch 2.13's ``torch.distributed.run`` parser is a flag of ``xrun``, in both spellings. Where a flag
names something xrun already has, it is an alias of xrun's flag (``--nproc_per_node`` of ``--num_gpus``,
``--virtual-local-rank`` of ``--device_per_rank``, ``-m`` of ``--module``); those every node's agent applies are
its flags too (``--role``, ``--numa-binding``, the duplicate filters: ``xrun.launch.agent_cli``); the others are
added here, and ``translate`` turns them into xrun's own options before those are read, so that the rest of xrun
sees one request whichever launcher's words it was written in. docs/migrating-from-torchrun.md says what each does.

What a torchrun line changes beyond its flags: torchrun never appends ``--local_rank=N`` to the script's arguments
(its scripts read ``LOCAL_RANK``), so a line that spells any flag only torchrun has runs in torchrun's form, without
it (``TORCHRUN_SPELLINGS``); ``--elastic`` typed by hand keeps xrun's own form.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from xrun.argsplit import spellings
from xrun.errors import UsageError
from xrun.hostlist import address_problem
from xrun.launch.agent_cli import parse_nnodes
from xrun.launch.elastic import rdzv
from xrun.launch.spec import DEFAULT_JOIN_TIMEOUT, parse_std
from xrun.printable import shown
from xrun.strict_numbers import MAX_SLOTS_PER_HOST, int_arg

START_METHODS = ("spawn", "fork", "forkserver")
# --signals-to-handle: signals xrun always handles itself (TERM, INT, HUP stop the job on every node; QUIT prints
# every rank's stack, docs/hang-doctor.md); any other signal named is forwarded to the ranks.
XRUN_HANDLED = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
_UNFORWARDABLE = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD})
# --nproc-per-node's words (torch.distributed.run.determine_local_world_size)
NPROC_WORDS = ("auto", "gpu", "cpu")
# The spellings only torchrun has: a line that uses one is a torchrun line, run in torchrun's form.
TORCHRUN_SPELLINGS = frozenset({
    "--standalone", "--nnodes", "--role", "-t", "--tee", "-r", "--redirects", "-m",
    *spellings("--nproc_per_node"), *spellings("--rdzv_backend"), *spellings("--rdzv_endpoint"),
    *spellings("--rdzv_id"), *spellings("--rdzv_conf"), *spellings("--local_ranks_filter"),
    *spellings("--duplicate_stdout_filters"), *spellings("--duplicate_stderr_filters"), *spellings("--run_path"),
    *spellings("--start_method"), *spellings("--event_log_handler"), *spellings("--logs_specs"),
    *spellings("--local_addr"), *spellings("--numa_binding"), *spellings("--signals_to_handle"),
    *spellings("--virtual_local_rank"),
})  # fmt: skip


def add_torchrun_flags(parser: argparse.ArgumentParser) -> None:
    """torchrun's flags that xrun did not have under another name (``--nnodes`` and ``--rdzv_*`` are the elastic
    group's, the aliases are with the flags they name)."""
    group = parser.add_argument_group("torchrun's flags (docs/migrating-from-torchrun.md)")
    add = group.add_argument
    add("--standalone", action="store_true", help="torchrun: one node, a local rendezvous (xrun's local run)")
    add("-t", "--tee", metavar="STD",
        help="torchrun: 0-3 (1 stdout, 2 stderr, 3 both) or LOCAL:STD,...: also write these ranks' output to "
        "per-rank logs (under --log_dir, else a new directory in the temporary directory)")
    add(*spellings("--run_path"), action="store_true", help="torchrun: run SCRIPT as a script (xrun's default)")
    add(*spellings("--start_method"), choices=START_METHODS, metavar="|".join(START_METHODS),
        help="torchrun: accepted; every rank is a fresh process, as torchrun runs a script")
    add(*spellings("--event_log_handler"), metavar="NAME", help="torchrun: accepted, not used (xrun has no event log)")
    add(*spellings("--logs_specs"), metavar="NAME", help="torchrun: accepted, not used (xrun writes its own logs)")
    add(*spellings("--local_addr"), metavar="ADDR",
        help="torchrun: this node's address; on a run of this machine only, rank 0's address (MASTER_ADDR)")
    add(*spellings("--signals_to_handle"), metavar="LIST",
        help="torchrun: TERM, INT, HUP (stop the job) and QUIT (stacks) are always handled; others are forwarded "
        "to the ranks, as --forward_signals")


def nproc_arg(text: str) -> int | str:
    """``--nproc_per_node``'s type: N, or torchrun's ``auto``, ``gpu``, ``cpu`` (resolved by ``resolve_nproc``)."""
    word = text.strip().lower()
    if word in NPROC_WORDS:
        return word
    try:
        return int_arg(high=MAX_SLOTS_PER_HOST)(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err}; or one of {', '.join(NPROC_WORDS)}") from None


def resolve_nproc(value: int | str | None, *, accelerators: int, cpus: int) -> int | None:
    """torchrun's meaning of ``--nproc_per_node``, counted on this machine: ``gpu`` every accelerator (none: an
    error), ``cpu`` a process per CPU, ``auto`` the accelerators where there are some, else a process per CPU.
    None: every slot (xrun's default)."""
    if value is None or isinstance(value, int):
        return value
    if value == "gpu":
        if accelerators == 0:
            raise UsageError("--nproc_per_node", "gpu: this machine has no accelerator; use cpu or a number")
        return None
    if value == "cpu" or accelerators == 0:
        return min(max(cpus, 1), MAX_SLOTS_PER_HOST)
    return None


@dataclass(frozen=True)
class Torchrun:
    """What a torchrun line asks for that the plan checks against the world (None and empty: nothing)."""

    form: bool = False  # the line spells a torchrun-only flag: no --local_rank=N (torchrun never passes it)
    nnodes: int | None = None  # --nnodes N or N:N on a static job: the world must have N nodes
    notes: tuple[str, ...] = ()  # one line each on stderr: a flag accepted that changes nothing under xrun


def torchrun_form(options: Sequence[str]) -> bool:
    """The launcher options (before the script) spell a flag only torchrun has."""
    names = {token.split("=", 1)[0] if token.startswith("--") else token[:2] for token in options}
    return bool(names & TORCHRUN_SPELLINGS)


def translate(ns: argparse.Namespace, options: Sequence[str]) -> tuple[argparse.Namespace, Torchrun]:
    """torchrun's flags of ``ns`` as xrun's own (a new namespace), and what the plan must still check."""
    out = argparse.Namespace(**vars(ns))
    form = torchrun_form(options) and not ns.elastic
    notes: list[str] = []
    nnodes = _nnodes(out)
    if ns.standalone:
        _standalone(out)
    elif not out.elastic and nnodes is not None and nnodes > 1 and _nodes_join_by_rendezvous(out):
        # torchrun's multi-node form with c10d (or etcd) and no --node_rank: torch numbers the nodes as they join,
        # so each node runs under torch's elastic agent, N nodes exactly (docs/elastic.md)
        out.elastic, out.nnodes, nnodes = True, f"{nnodes}:{nnodes}", None
    elif not out.elastic:
        if nnodes is not None and nnodes > 1:
            _one_launcher_per_node(out, nnodes)
        _static_rendezvous(out)
    _rank_command(out, form=form)
    if ns.signals_to_handle is not None:
        out.forward_signals = _signals(ns.signals_to_handle, ns.forward_signals)
    if ns.local_addr is not None:
        notes += _local_addr(out)
    if ns.logs_specs is not None:
        notes.append(f"--logs-specs {ns.logs_specs} is not used: xrun writes its own per-rank logs (--log_dir)")
    if ns.event_log_handler not in (None, "null"):
        notes.append(f"--event-log-handler {ns.event_log_handler} is not used: xrun has no torch event log")
    _log_dir(out)
    return out, Torchrun(form=form, nnodes=nnodes, notes=tuple(notes))


def _nnodes(out: argparse.Namespace) -> int | None:
    """``--nnodes`` without ``--elastic``: ``N`` or ``N:N`` is a static job of N nodes; ``MIN:MAX`` an elastic one."""
    if out.nnodes is None or out.elastic:
        return None
    lo, hi = parse_nnodes(out.nnodes)
    if lo < 1:
        raise UsageError("--nnodes", f"{shown(out.nnodes)}: a job needs at least 1 node")
    if lo > hi:
        raise UsageError("--nnodes", f"{shown(out.nnodes)}: MIN is more than MAX (write {hi}:{lo})")
    if lo != hi:  # torchrun's elastic range: xrun's --elastic (torch's agent on every node)
        out.elastic = True
        return None
    out.nnodes = None
    return lo


def _nodes_join_by_rendezvous(out: argparse.Namespace) -> bool:
    """No host list, no node rank, a dynamic rendezvous backend: the nodes find each other at the endpoint."""
    return (out.hostfile is None and out.hosts is None and out.node_rank is None and not out.pod
            and out.rdzv_backend not in (None, "static"))


def _one_launcher_per_node(out: argparse.Namespace, nnodes: int) -> None:
    """torchrun's multi-node form, ``--nnodes N --node_rank K --master_addr A`` started on every node, and no host
    list: xrun's pod mode with N numbered nodes (docs/pod-mode.md), which is how xrun is started by hand."""
    if out.hostfile is not None or out.hosts is not None:
        return  # xrun starts the hosts itself (or, with --pod, every node its share of the named hosts)
    if out.node_rank is None:
        out.node_rank = 0  # torchrun's default (static rendezvous; a dynamic one went to _nodes_join_by_rendezvous)
    out.pod = True
    out.num_nodes = out.num_nodes if out.num_nodes is not None else nnodes


def _standalone(out: argparse.Namespace) -> None:
    """torchrun: one node, a local c10d store on a free port, a random id; explicit --rdzv_* values are ignored.
    xrun's run of this machine is all of that already."""
    for flag, value in (("-H/--hostfile", out.hostfile), ("--hosts", out.hosts)):
        if value is not None:
            raise UsageError("--standalone", f"runs on this machine only; leave out {flag}")
    if out.pod or out.elastic:
        raise UsageError("--standalone", "runs on this machine only; leave out --pod/--elastic and --nnodes MIN:MAX")
    out.rdzv_backend = out.rdzv_endpoint = out.rdzv_id = out.rdzv_conf = None


def _static_rendezvous(out: argparse.Namespace) -> None:
    """torchrun's ``--rdzv_*`` on a static job: the endpoint is rank 0's address and port (port 0: a free one), the
    id is the run id, ``join_timeout`` is ``--join_timeout``; other c10d keys time a store xrun does not use."""
    backend = out.rdzv_backend
    if backend is not None and backend not in ("c10d", "static"):
        raise UsageError("--rdzv_backend", f"{shown(backend)}: a static job meets at rank 0's store (c10d or static); "
                         f"{backend} applies with --elastic or --nnodes MIN:MAX")
    if out.rdzv_endpoint is not None:
        _endpoint(out, out.rdzv_endpoint)
    if out.rdzv_id is not None and out.run_id is None:
        out.run_id = out.rdzv_id
    if out.rdzv_conf:
        conf = rdzv.parse_rdzv_conf(out.rdzv_conf)
        rdzv.check_rdzv_conf("c10d", conf)
        if "join_timeout" in conf and out.join_timeout == DEFAULT_JOIN_TIMEOUT:
            out.join_timeout = float(conf["join_timeout"])
    out.rdzv_backend = out.rdzv_endpoint = out.rdzv_id = out.rdzv_conf = None
    out.monitor_interval = None  # torchrun's poll period; xrun sees an exit at once


_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "")


def _endpoint(out: argparse.Namespace, text: str) -> None:
    host, sep, port_text = text.rpartition(":") if not text.endswith("]") else (text, "", "")
    if not sep:
        host, port_text = text, ""
    host = host.strip("[]")
    if port_text:
        if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
            raise UsageError("--rdzv_endpoint", f"{shown(text)}: the port must be 0..65535 (0: a free one)")
        port = int(port_text)
        if port and out.master_port not in (None, 0, port):
            raise UsageError("--rdzv_endpoint", f"{shown(text)}: its port is not --master_port {out.master_port}; "
                             "give one of them")
        if port:
            out.master_port = port
    if host not in _LOCAL_NAMES:
        problem = address_problem(host)
        if problem:
            raise UsageError("--rdzv_endpoint", f"{shown(text)}: {problem}")
        if out.master_addr not in (None, host):
            raise UsageError("--rdzv_endpoint", f"{shown(text)}: its host is not --master_addr {out.master_addr}; "
                             "give one of them")
        out.master_addr = host


def _rank_command(out: argparse.Namespace, *, form: bool) -> None:
    if form:
        out.no_local_rank = True  # torchrun passes no --local_rank: its scripts read LOCAL_RANK
    if out.run_path:  # torchrun: runpy.run_path, ahead of --module and --no-python; a script run as __main__
        out.module = out.no_python = False


def _signals(text: str, forward: str | None) -> str:
    """``--signals-to-handle``: the names checked; those xrun does not handle itself join ``--forward_signals``."""
    extra: list[str] = []
    for part in filter(None, (p.strip().upper() for p in text.split(","))):
        name = part if part.startswith("SIG") else f"SIG{part}"
        try:
            signum = signal.Signals[name]
        except KeyError:
            raise UsageError("--signals-to-handle", f"{shown(text)}: {shown(part)} is not a signal name; "
                             "e.g. SIGTERM,SIGINT,SIGUSR1") from None
        if signum in _UNFORWARDABLE:
            raise UsageError("--signals-to-handle", f"{shown(text)}: {name} cannot be handled")
        if signum not in XRUN_HANDLED:
            extra.append(name.removeprefix("SIG"))
    given = [p for p in (forward if forward is not None else "USR1,USR2").split(",") if p.strip()]
    return ",".join(dict.fromkeys([*given, *extra]))


def _local_addr(out: argparse.Namespace) -> list[str]:
    problem = address_problem(out.local_addr)
    if problem:
        raise UsageError("--local-addr", problem)
    if out.hostfile is None and out.hosts is None and not out.pod and out.master_addr is None:
        out.master_addr = out.local_addr
        return []
    return [f"--local-addr {out.local_addr} is not used: each node's address is the one on the route to the "
            "master (--master_addr, --network_interface)"]


def _log_dir(out: argparse.Namespace) -> None:
    """``--tee``, ``--redirects`` and the duplicate filters write per-rank logs: a log directory if none is given
    (the console's rules themselves are every node's agent's: ``xrun.launch.spec.local_echo``)."""
    logs = bool(out.duplicate_stdout_filters or out.duplicate_stderr_filters)  # beside the rank logs
    for flag, text in (("--tee", out.tee), ("--redirects", out.redirects)):
        if text is not None:
            std = parse_std(flag, text)
            logs = logs or bool(any(std.values()) if isinstance(std, dict) else std)
    if logs and out.log_dir is None:
        # torchrun: a new directory under the temporary directory; xrun names it after the run so that every node
        # of the job writes under the same path.
        out.log_dir = f"{tempfile.gettempdir()}/torchelastic_{os.urandom(4).hex()}"
        print(f"xrun: --tee/--redirects/--duplicate-*-filters: per-rank logs under {out.log_dir} (--log_dir chooses)",
              file=sys.stderr)
