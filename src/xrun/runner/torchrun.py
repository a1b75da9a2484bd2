"""torchrun's command line, accepted with its meaning (issue 41): swap the word ``torchrun`` for ``xrun``.

Every flag of torch 2.13's ``torch.distributed.run`` parser is a flag of ``xrun``, in both spellings. Where a flag
names something xrun already has, it is an alias of xrun's flag (``--nproc_per_node`` of ``--num_gpus``,
``--virtual-local-rank`` of ``--device_per_rank``, ``-m`` of ``--module``); those every node's agent applies are its
flags too (``--role``, ``--numa-binding``, the duplicate filters, ``--local-ranks-filter`` and ``--redirects``,
which each node applies per local rank and stream: ``xrun.common.agent_cli``); the others are added here, and
``translate`` turns them into xrun's own options before those are read, so that the rest of xrun sees one request
whichever launcher's words it was written in. docs/migrating-from-torchrun.md says what each does.

What a torchrun line changes beyond its flags: torchrun never appends ``--local_rank=N`` to the script's arguments
(its scripts read ``LOCAL_RANK``), so a line that spells any flag only torchrun has runs in torchrun's form, without
it (``TORCHRUN_SPELLINGS``), as does a run that reads a flag from torchrun's ``PET_*`` variables
(``read_pet_defaults``: torchrun's parser takes each flag's default from ``PET_<FLAG>``); ``--elastic`` typed by
hand keeps xrun's own form.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from xrun.argsplit import spellings
from xrun.common import rdzv
from xrun.common.agent_cli import parse_nnodes
from xrun.common.spec import DEFAULT_JOIN_TIMEOUT, parse_std
from xrun.errors import UsageError
from xrun.hostlist import address_problem
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


# torchrun's parser (torch.distributed.argparse_util env/check_env) takes each of these flags' default from
# PET_<DEST>: a value, or for a switch an integer (0 off, else on); logs_specs and numa_binding read none.
PET_FLAGS = ("--nnodes", "--nproc_per_node", "--rdzv_backend", "--rdzv_endpoint", "--rdzv_id", "--rdzv_conf",
             "--standalone", "--max_restarts", "--monitor_interval", "--start_method", "--event_log_handler", "--role",
             "--module", "--no_python", "--run_path", "--log_dir", "--redirects", "--tee", "--local_ranks_filter",
             "--duplicate_stdout_filters", "--duplicate_stderr_filters", "--node_rank", "--master_addr",
             "--master_port", "--local_addr", "--signals_to_handle", "--shutdown_timeout", "--virtual_local_rank")
# A Kubeflow pod (PET_NNODES set) is the platform's (xrun.runner.pod.platforms): it reads the job's shape from these
# and numbers the nodes itself, so they are not also read as flags there (one reading, one place).
PET_PLATFORM = frozenset({"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NPROC_PER_NODE",
                          "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF", "PET_STANDALONE"})


def pet_variable(flag: str) -> str:
    return "PET_" + flag.lstrip("-").upper()


def read_pet_defaults(parser: argparse.ArgumentParser, ns: argparse.Namespace, options: Sequence[str],
                      environ: Mapping[str, str]) -> list[str]:
    """torchrun's ``PET_*`` variables as the defaults of its flags, into ``ns`` where the command line did not give
    the flag; a bad value is a UsageError naming the variable. Returns the flags so read."""
    given = {token.split("=", 1)[0] if token.startswith("--") else token[:2] for token in options}
    read: list[str] = []
    for flag in PET_FLAGS:
        variable = pet_variable(flag)
        text = environ.get(variable)
        if text is None or ("PET_NNODES" in environ and variable in PET_PLATFORM):
            continue
        action = parser._option_string_actions[flag]  # noqa: SLF001 - argparse's table of spellings
        if given & set(action.option_strings):
            continue  # the command line wins
        setattr(ns, action.dest, _pet_value(action, variable, text))
        read.append(flag)
    return read


@contextmanager
def blaming_pet(read: Sequence[str]) -> Iterator[None]:
    """A flag's value read from its ``PET_*`` variable and refused later (its range, its meaning against the other
    flags) is one line naming the variable too: ``PET_MASTER_PORT (--master_port): 99999 is not a TCP port``."""
    try:
        yield
    except UsageError as err:
        name = err.flag.split()[0].lstrip("-").replace("-", "_")
        flag = next((f for f in read if f.lstrip("-") == name), None)
        if flag is None:
            raise
        raise UsageError(f"{pet_variable(flag)} ({err.flag})", err.reason) from None


def _pet_value(action: argparse.Action, variable: str, text: str) -> object:
    if action.nargs == 0:  # a switch: torch's check_env reads bool(int(value))
        try:
            return bool(int(text))
        except ValueError:
            raise UsageError(variable, f"{shown(text)} is not 0 or 1 (torchrun reads an integer: 0 off, else on)") \
                from None
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError) as err:
        raise UsageError(variable, f"{shown(text)}: {err}") from None
    if action.choices is not None and value not in action.choices:
        raise UsageError(variable, f"{shown(text)} is not one of {', '.join(map(str, action.choices))}")
    return value


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


def translate(ns: argparse.Namespace, options: Sequence[str], *, pet: bool = False,
              ) -> tuple[argparse.Namespace, Torchrun]:
    """torchrun's flags of ``ns`` as xrun's own (a new namespace), and what the plan must still check. ``pet``: a
    ``PET_*`` variable gave a flag (``read_pet_defaults``), so this is a torchrun run whatever the line spells."""
    out = argparse.Namespace(**vars(ns))
    form = (pet or torchrun_form(options)) and not ns.elastic
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


_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def _endpoint(out: argparse.Namespace, text: str) -> None:
    host, port = rdzv.parse_endpoint(text, port_zero=True)
    if port:
        if out.master_port not in (None, 0, port):
            raise UsageError("--rdzv_endpoint", f"{shown(text)}: its port is not --master_port {out.master_port}; "
                             "give one of them")
        out.master_port = port
    if host not in _LOCAL_NAMES:
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
    (the console's rules themselves are every node's agent's: ``xrun.common.spec.local_echo``)."""
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
