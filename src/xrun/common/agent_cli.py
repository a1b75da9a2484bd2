"""``python -m xrun.launch``: the node agent's command line, DeepSpeed-compatible.

    python -m xrun.launch --world_info=B64 --node_rank=N --master_addr=A --master_port=P [options] SCRIPT ARGS...
    python -m xrun.launch --connect=HEAD:PORT --node_rank=K --token=-        (a multi-node run: xrun.launch.session)

This module parses; ``xrun.common.command`` renders both forms (``parse_agent_argv(agent_argv(c)[4:]) == c``),
so the runner's dry-run and the agent agree. The flag groups are shared with the runner's own command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

from xrun.argsplit import spellings, split_argv
from xrun.common import rdzv
from xrun.common.command import AgentCommand
from xrun.common.network.socket_ifname import AUTO, check_mode
from xrun.common.rankplan import DEFAULT_ROLE, LaunchOptions, Rendezvous, decode_world_info
from xrun.common.result.outcome import HANG_EXIT
from xrun.common.spec import (
    DEFAULT_FORWARD_SIGNALS,
    DEFAULT_JOIN_TIMEOUT,
    DEFAULT_MASTER_PORT,
    DEFAULT_SHUTDOWN_TIMEOUT,
    NUMA_MODES,
    RDZV_BACKENDS,
    AgentOptions,
    ElasticOptions,
    HangAction,
    OnRankExit,
    PythonMode,
    local_echo,
    parse_filter_list,
    parse_module_list,
    parse_rank_list,
    parse_signal_list,
    signal_list,
)
from xrun.errors import UsageError, XrunError
from xrun.hostlist import address_problem
from xrun.printable import shown
from xrun.strict_numbers import MAX_HOSTS, MAX_RESTARTS, MAX_SHUTDOWN_TIMEOUT, int_arg, parse_int, port_arg, seconds_arg


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise XrunError(f"{message}; see python -m xrun.launch --help")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m xrun.launch",
        usage="python -m xrun.launch --world_info=B64 --node_rank=N [options] SCRIPT [ARGS...]",
        description="xrun node agent: starts and supervises this node's ranks.",
        allow_abbrev=False,  # a flag means the same in every release
    )
    add = parser.add_argument
    add(*spellings("--world_info"), required=True, help="base64 JSON {host: [slots]} (DeepSpeed format)")
    add(*spellings("--node_rank"), type=int_arg(high=MAX_HOSTS), required=True, help="this node's index in the world")
    add(*spellings("--master_addr"), default="127.0.0.1", help="rank 0's address (default 127.0.0.1)")
    add(*spellings("--master_port"), type=port_arg, default=DEFAULT_MASTER_PORT, help="rendezvous port (default 29500)")
    add(*spellings("--run_id"), default="xrun", help="job id, exported as TORCHELASTIC_RUN_ID")
    add_rank_command_flags(parser)
    add_agent_flags(parser)
    add_elastic_flags(parser, join_timeout=True)
    return parser


def add_rank_command_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that shape each rank's argv (shared with the runner's command line)."""
    add = parser.add_argument
    add(*spellings("--no_local_rank"), action="store_true", help="do not append --local_rank=N to the script's args")
    add("-m", "--module", action="store_true", help="run SCRIPT as a module: python -u -m SCRIPT")
    add(*spellings("--no_python"), action="store_true", help="run SCRIPT directly, not through python")
    add(*spellings("--device_per_rank"), *spellings("--virtual_local_rank"), dest="device_per_rank",
        action="store_true",
        help="each rank sees only its own device (CUDA_VISIBLE_DEVICES=its slot, LOCAL_RANK=0, --local_rank=0)")
    add("--role", metavar="NAME", help="the ranks' role name, ROLE_NAME (torchrun's; default: default)")


def add_agent_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that shape supervision, binding and logging (shared with the runner's command line)."""
    add = parser.add_argument
    add(*spellings("--log_dir"), *spellings("--enable_each_rank_log"), dest="log_dir", metavar="DIR",
        help="write per-rank logs under DIR/<host>/rank<N>/{stdout,stderr}.log")
    add(*spellings("--no_prefix"), action="store_true", help="print ranks' output without the [host:rank] prefix")
    add("--quiet", action="store_true", help="no console echo of rank output (logs only)")
    add(*spellings("--no_dedupe"), action="store_true",
        help="print identical lines of several ranks once per rank (default: once, with the rank set)")
    add(*spellings("--shutdown_timeout"), type=seconds_arg(high=MAX_SHUTDOWN_TIMEOUT), default=DEFAULT_SHUTDOWN_TIMEOUT,
        metavar="SECONDS",
        help=f"grace between SIGTERM and SIGKILL when stopping ranks (default {DEFAULT_SHUTDOWN_TIMEOUT:g})")
    add(*spellings("--bind_cores_to_rank"), action="store_true", help="split this node's CPUs among its ranks")
    add(*spellings("--bind_core_list"), metavar="LIST", help="restrict binding to these CPUs, e.g. 0-3,8-11")
    add(*spellings("--numa_binding"), choices=NUMA_MODES, metavar="|".join(NUMA_MODES),
        help="torchrun's: bind each rank near its GPU: node (its GPU's NUMA node), socket (that node's socket), "
        "exclusive (whole cores of that node, one set per rank), core-complex (one last-level cache of that node)")
    add(*spellings("--console_ranks"), metavar="RANKS",
        help="echo only these global ranks' output, e.g. 0 or 0,2-3 (the others still write their log files, "
        "and a failing rank's stderr tail is always in the report)")
    add(*spellings("--forward_signals"), metavar="LIST",
        help=f"signals passed on to every rank on every node without stopping the job "
        f"(default {signal_list(DEFAULT_FORWARD_SIGNALS)}; empty: none)")
    add(*spellings("--hang_timeout"), type=seconds_arg(), metavar="SECONDS",
        help="when no rank anywhere has written output for this long, print every rank's stack, merged "
        "(a hang); see --hang_action")
    add(*spellings("--hang_action"), choices=[a.value for a in HangAction], metavar="dump|stop|restart",
        help="with --hang_timeout: dump (default) prints the stacks and goes on; stop also stops the job "
        f"(exit code {HANG_EXIT}); restart stops it as a failure that --max_restarts restarts")
    add(*spellings("--on_rank_exit"), choices=[a.value for a in OnRankExit], metavar="stop|keep",
        help="stop (default): the first rank that fails stops the others; keep: for in-process recovery (NVRx's "
        "inprocess.Wrapper), a rank's exit signals no other rank, the job ends with its last rank and the "
        "survivors' exit codes decide (docs/in-process-recovery.md)")
    add(*spellings("--no_failure_stacks"), action="store_true",
        help="when a rank fails, do not put the other ranks' stacks in the failure report")
    add(*spellings("--no_telemetry"), action="store_true",
        help="do not serve the ranks' collective records (torch's Flight Recorder, on a Unix socket per rank) that "
        "name the collective a hang waits in and the rank that holds a job back")
    add(*spellings("--network_interface"), metavar="NAME|auto|none",
        help="the interface for GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME of every rank: auto (default: on a job "
        "of several nodes, each node's interface on the route to the master address), NAME (every node; also "
        "btl_tcp_if_include / -iface for mpirun and hydra), none (set nothing). A value you set is kept")
    add(*spellings("--duplicate_stdout_filters"), metavar="WORDS",
        help="torchrun's: copy the ranks' stdout lines holding one of these comma-separated words (a double comma "
        "is a comma) to {log_dir}/{host}/filtered_stdout.log; needs --log_dir")
    add(*spellings("--duplicate_stderr_filters"), metavar="WORDS",
        help="the same for stderr, to filtered_stderr.log")
    add(*spellings("--local_ranks_filter"), metavar="LOCAL_RANKS",
        help="torchrun's: echo only these local ranks on every node, e.g. 0 or 0,1 (the others still write their logs)")
    add("-r", "--redirects", metavar="STD",
        help="torchrun's: 0-3 (1 stdout, 2 stderr, 3 both) or LOCAL:STD,...: these streams of the ranks go to their "
        "log files only, not to the console (under --log_dir, else a new directory in the temporary directory)")
    add("--preload", metavar="MODULE[,MODULE...]",
        help=f"import these modules once per node in a helper process and fork every rank from it, so a start and "
        f"a restart skip their import (default: ${PRELOAD_VARIABLE}); a python program only, not with --elastic")


def add_elastic_flags(parser: argparse.ArgumentParser, *, join_timeout: bool) -> None:
    """``--elastic`` and torchrun's elastic flags (shared with the runner, which has its own --join_timeout)."""
    group = parser.add_argument_group("elastic (torch's elastic agent; needs torch on every node)")
    add = group.add_argument
    add("--elastic", action="store_true",
        help="run each node's ranks under torch's elastic agent: restarts, nodes leaving and joining")
    add("--nnodes", metavar="MIN[:MAX]",
        help="node count or range (torchrun's): with --elastic the range; xrun without it: N or N:N a static job of N "
        "nodes, MIN:MAX an elastic one")
    add(*spellings("--min_nodes"), type=int_arg(high=MAX_HOSTS),
        metavar="N", help="with --elastic: fewest nodes to run (default: max)")
    add(*spellings("--max_nodes"), type=int_arg(high=MAX_HOSTS),
        metavar="N", help="with --elastic: most nodes (default: hosts selected)")
    add(*spellings("--max_restarts"), type=int_arg(high=MAX_RESTARTS),
        metavar="N", help="restarts after a failure (default 0): of the whole job on every node (xrun's own), of "
        "each replica group alone with --replica_groups, or with --elastic of each node's worker group (torch's agent)")
    add(*spellings("--rdzv_backend"), metavar="NAME",
        help=f"with --elastic: {', '.join(RDZV_BACKENDS)} (default c10d)")
    add(*spellings("--rdzv_endpoint"), metavar="HOST:PORT",
        help="with --elastic: the rendezvous store (default: master address and port)")
    add(*spellings("--rdzv_id"), metavar="ID", help="with --elastic: rendezvous id (default: the run id)")
    add(*spellings("--rdzv_conf"), action="append", metavar="K=V[,K=V]",
        help="with --elastic: extra rendezvous settings; keys the backend would ignore are an error")
    add(*spellings("--monitor_interval"), type=seconds_arg(high=3600), metavar="SECONDS",
        help="with --elastic: how often torch's agent checks the workers (default 0.1)")
    if join_timeout:
        add(*spellings("--join_timeout"), type=seconds_arg(), default=DEFAULT_JOIN_TIMEOUT, metavar="SECONDS",
            help=f"with --elastic: how long to wait for the last node (default {DEFAULT_JOIN_TIMEOUT:g})")


_ELASTIC_ONLY = ("nnodes", "min_nodes", "max_nodes", "max_restarts", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
                 "rdzv_conf", "monitor_interval")  # fmt: skip


def elastic_options(ns: argparse.Namespace, *, static_restarts: bool = False) -> ElasticOptions | None:
    """The elastic request (node counts may stay open until the world is known); None without --elastic.
    ``static_restarts``: --max_restarts also applies without --elastic (the runner restarts the whole job)."""
    given = [name for name in _ELASTIC_ONLY if getattr(ns, name) is not None
             and not (static_restarts and name == "max_restarts")]
    if not ns.elastic:
        if given:
            raise UsageError(f"--{given[0]}", "only applies with --elastic")
        return None
    lo, hi = ns.min_nodes, ns.max_nodes
    if ns.nnodes is not None:
        if lo is not None or hi is not None:
            raise UsageError("--nnodes", "give either --nnodes MIN:MAX or --min_nodes/--max_nodes, not both")
        lo, hi = parse_nnodes(ns.nnodes)
    backend = ns.rdzv_backend or "c10d"
    conf = rdzv.parse_rdzv_conf(ns.rdzv_conf or ())
    rdzv.check_rdzv_conf(backend, conf)
    rdzv.check_backend_available(backend)
    if ns.rdzv_endpoint is not None:
        rdzv.parse_endpoint(ns.rdzv_endpoint)
    return ElasticOptions(
        min_nodes=lo,
        max_nodes=hi,
        max_restarts=ns.max_restarts if ns.max_restarts is not None else 0,
        rdzv_backend=backend,
        rdzv_endpoint=ns.rdzv_endpoint,
        rdzv_id=ns.rdzv_id or getattr(ns, "run_id", None),  # an explicit --run_id is the rendezvous id too
        rdzv_conf=conf,
        join_timeout=ns.join_timeout,
        monitor_interval=ns.monitor_interval if ns.monitor_interval is not None else 0.1,
    )


def parse_nnodes(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` (torchrun's ``--nnodes``)."""
    lo_text, sep, hi_text = text.partition(":")
    lo = parse_int(lo_text)
    hi = parse_int(hi_text) if sep else lo
    if lo is None or hi is None:
        raise UsageError("--nnodes", f"{shown(text)} is not N or MIN:MAX (ASCII digits)")
    if max(lo, hi) > MAX_HOSTS:
        raise UsageError("--nnodes", f"{shown(text)}: at most {MAX_HOSTS} nodes")
    return lo, hi


def launch_options(ns: argparse.Namespace, python: str = sys.executable) -> LaunchOptions:
    if ns.module and ns.no_python:
        raise UsageError("--module", "cannot be combined with --no_python (a module needs python)")
    mode = PythonMode.MODULE if ns.module else PythonMode.NONE if ns.no_python else PythonMode.SCRIPT
    if ns.device_per_rank and getattr(ns, "elastic", False):
        raise UsageError("--device_per_rank", "does not apply with --elastic (torch's agent sets LOCAL_RANK)")
    if ns.role is not None and not ns.role.strip():
        raise UsageError("--role", "is empty; give the ranks' role name (ROLE_NAME), e.g. trainer")
    return LaunchOptions(python=python, mode=mode, local_rank_arg=not ns.no_local_rank,
                         device_per_rank=ns.device_per_rank, role=ns.role or DEFAULT_ROLE)


def agent_options(ns: argparse.Namespace) -> AgentOptions:
    if ns.shutdown_timeout < 0:
        raise UsageError("--shutdown_timeout", f"must be >= 0 seconds, not {ns.shutdown_timeout:g}")
    if ns.numa_binding is not None and ns.bind_cores_to_rank:
        raise UsageError("--numa-binding", "give it or --bind_cores_to_rank, not both (each chooses the CPUs)")
    if ns.bind_core_list is not None and not (ns.bind_cores_to_rank or ns.numa_binding):
        raise UsageError("--bind_core_list", "only applies with --bind_cores_to_rank")
    if ns.hang_timeout is not None and ns.hang_timeout <= 0:
        raise UsageError("--hang_timeout", f"must be more than 0 seconds, not {ns.hang_timeout:g}")
    if ns.hang_action is not None and ns.hang_timeout is None:
        raise UsageError("--hang_action", "only applies with --hang_timeout")
    if ns.on_rank_exit == OnRankExit.KEEP.value and getattr(ns, "elastic", False):
        raise UsageError("--on_rank_exit", "keep does not apply with --elastic (torch's agent owns the workers)")
    if ns.hang_timeout is not None and getattr(ns, "elastic", False):
        raise UsageError("--hang_timeout", "does not apply with --elastic (torch's agent owns the workers)")
    stdout_words = parse_filter_list(ns.duplicate_stdout_filters or "")
    stderr_words = parse_filter_list(ns.duplicate_stderr_filters or "")
    if (stdout_words or stderr_words) and ns.log_dir is None:
        raise UsageError("--duplicate-stdout-filters" if stdout_words else "--duplicate-stderr-filters",
                         "needs --log_dir (the copies go to {log_dir}/{host}/filtered_std{out,err}.log)")
    return AgentOptions(
        log_dir=ns.log_dir,
        prefix=not ns.no_prefix,
        quiet=ns.quiet,
        dedupe=not ns.no_dedupe,
        shutdown_timeout=ns.shutdown_timeout,
        bind_cores=ns.bind_cores_to_rank or ns.numa_binding is not None,
        numa_binding=ns.numa_binding,
        duplicate_stdout_filters=stdout_words,
        duplicate_stderr_filters=stderr_words,
        local_echo=local_echo(ns.local_ranks_filter, ns.redirects),
        bind_core_list=ns.bind_core_list,
        console_ranks=parse_rank_list("--console_ranks", ns.console_ranks) if ns.console_ranks is not None else None,
        forward_signals=(
            parse_signal_list("--forward_signals", ns.forward_signals)
            if ns.forward_signals is not None
            else DEFAULT_FORWARD_SIGNALS
        ),
        hang_timeout=ns.hang_timeout,
        hang_action=HangAction(ns.hang_action or HangAction.DUMP.value),
        on_rank_exit=OnRankExit(ns.on_rank_exit or OnRankExit.STOP.value),
        failure_stacks=not ns.no_failure_stacks,
        network_interface=check_mode("--network_interface", ns.network_interface or AUTO),
        telemetry=not ns.no_telemetry,
    )


PRELOAD_VARIABLE = "XRUN_PRELOAD"  # --preload for every job that does not give the flag (empty: none)


def preload_option(ns: argparse.Namespace, script: str, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The modules to preload (docs/preload.md): ``--preload``'s, else ``$XRUN_PRELOAD``'s; none without either.
    Where ranks cannot be forked, the flag is refused (exit 2), and the variable, set for every job, is left unused
    with one line saying why: the job runs as usual."""
    given = ns.preload is not None
    text = ns.preload if given else environ.get(PRELOAD_VARIABLE, "")
    if not given and not text:
        return ()
    source = "--preload" if given else PRELOAD_VARIABLE
    modules = parse_module_list(source, text)
    why = _not_forkable(ns, script)
    if why is None:
        return modules
    if given:
        raise UsageError("--preload", f"does not apply {why}; leave --preload out")
    print(f"xrun: {PRELOAD_VARIABLE}={text} is not used for this job: it does not apply {why}", file=sys.stderr)
    return ()


def _not_forkable(ns: argparse.Namespace, script: str) -> str | None:
    """Why the ranks of this command line cannot be forked from a preload helper (None: they can)."""
    if getattr(ns, "elastic", False):
        return "with --elastic (torch's elastic agent starts the ranks)"
    if ns.no_python:
        return "with --no_python (the program runs without python)"
    if not ns.module and script.endswith((".pyc", ".pyo")):
        return "to compiled bytecode (a .pyc script: the helper runs source as python would)"
    return None


def _check_rendezvous(addr: str, port: int) -> None:
    """What every rank gets as MASTER_ADDR/MASTER_PORT: the ranks would only fail later, each on its own, in
    torch's rendezvous (port 0 or 99999, an address with a space). xrun itself checks its own flags the same."""
    problem = address_problem(addr)
    if problem:
        raise UsageError("--master_addr", problem)
    if not 1 <= port <= 65535:
        raise UsageError("--master_port", f"{port} is not a TCP port (1..65535)")


def parse_agent_argv(argv: Sequence[str]) -> AgentCommand:
    parser = build_parser()
    split = split_argv(parser, argv)
    ns = parser.parse_args(list(split.options))
    if split.program is None:
        raise XrunError(f"missing SCRIPT; usage: {parser.usage}")
    _check_rendezvous(ns.master_addr, ns.master_port)
    return AgentCommand(
        world=decode_world_info(ns.world_info),
        node_rank=ns.node_rank,
        rendezvous=Rendezvous(ns.master_addr, ns.master_port, ns.run_id),
        launch=launch_options(ns),
        options=replace(agent_options(ns), preload=preload_option(ns, split.program, os.environ)),
        script=split.program,
        args=split.program_args,
        elastic=elastic_options(ns, static_restarts=True),
        max_restarts=0 if ns.elastic else ns.max_restarts or 0,  # with --elastic: torch's, in ``elastic``
    )
