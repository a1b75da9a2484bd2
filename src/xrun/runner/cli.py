"""``xrun``: the head-node command line. ``parse_request`` turns argv into a ``JobRequest``; ``main`` is wiring:
parse -> plan (``xrun.runner.planner``) -> validate -> print the dry run or execute. The runs whose head and node
share xrun's process come in as ``InProcess`` from the entry point above both layers (``xrun.joined``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from xrun import __version__
from xrun.argsplit import spellings, split_argv
from xrun.common.agent_cli import (
    add_agent_flags,
    add_elastic_flags,
    add_rank_command_flags,
    agent_options,
    elastic_options,
    launch_options,
    preload_option,
)
from xrun.common.procs.posix import leave
from xrun.common.spec import DEFAULT_MASTER_PORT
from xrun.errors import UsageError, XrunError
from xrun.fdlimit import raise_open_files_limit
from xrun.hostlist import address_problem
from xrun.printable import one_line
from xrun.runner.backends import known_backends
from xrun.runner.backends.base import InProcess, get_backend
from xrun.runner.dryrun import print_plan
from xrun.runner.hosts.selection import Selection
from xrun.runner.hosts.this_machine import count_accelerators
from xrun.runner.metrics_options import add_metrics_flags, metrics_options
from xrun.runner.plan import JobRequest, PortChoice
from xrun.runner.planner import plan_job
from xrun.runner.pod.options import add_pod_flags, pod_request
from xrun.runner.remote_options import add_remote_flags, remote_options
from xrun.runner.replica_options import add_replica_flags, replica_request
from xrun.runner.restart_options import add_restart_flags, restart_policy
from xrun.runner.torchrun import (
    add_torchrun_flags,
    blaming_pet,
    nproc_arg,
    read_pet_defaults,
    resolve_nproc,
    translate,
)
from xrun.runner.validate import validate
from xrun.std_streams import tolerant_streams
from xrun.strict_numbers import MAX_HOSTS, int_arg, port_arg

DRY_RUN_FORMATS = ("text", "json")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise XrunError(f"{message}; see xrun --help")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="xrun",
        usage="xrun [-H HOSTFILE] [-i SPEC | -e SPEC] [options] SCRIPT [ARGS...]",
        description="Launch a PyTorch training script on this machine or on every host of a hostfile.",
        epilog="Everything after SCRIPT is passed to it untouched. Every flag: docs/flags.md.",
        allow_abbrev=False,  # a flag means the same in every release: --nnode is not --nnodes
    )
    add = parser.add_argument
    add("--version", action="version", version=f"xrun {__version__}")
    add("-H", "--hostfile", metavar="PATH", help="hostfile with lines 'HOST slots=N' (default: this machine only)")
    add("-i", "--include", metavar="SPEC", help="keep only these hosts/slots: HOST[:SLOT,...][@HOST...]")
    add("-e", "--exclude", metavar="SPEC", help="drop these hosts/slots: HOST[:SLOT,...][@HOST...]")
    add(*spellings("--num_nodes"), type=int_arg(high=MAX_HOSTS), metavar="N", help="use the first N hosts")
    add(*spellings("--num_gpus"), *spellings("--num_accelerators"), *spellings("--nproc_per_node"),
        dest="num_gpus", type=nproc_arg, metavar="N",
        help="use slots 0..N-1 of every host (CPU: N processes); torchrun's auto, gpu, cpu: counted on this machine")
    add(*spellings("--master_addr"), metavar="ADDR", help="rank 0's address (default: first host; 127.0.0.1 locally)")
    add(*spellings("--master_port"), type=port_arg, metavar="PORT",
        help=f"rendezvous port (default: a free one; {DEFAULT_MASTER_PORT} on several nodes when free on node 0)")
    add("--launcher", metavar="NAME", help=f"backend that starts the node agents: {', '.join(known_backends())}")
    add(*spellings("--run_id"), metavar="ID",
        help="job id (default: random; pod mode: xrun-MASTER-PORT), exported as TORCHELASTIC_RUN_ID")
    add("--python", metavar="PATH", default=sys.executable, help="interpreter for agents and ranks (default: this one)")
    add("--dry-run", "--dry_run", dest="dry_run", nargs="?", const="text", metavar="FORMAT",
        help="print the plan and the exact commands, start nothing; --dry-run=json prints one JSON object")
    add_rank_command_flags(parser)
    add_agent_flags(parser)
    add_remote_flags(parser)
    add_elastic_flags(parser, join_timeout=False)  # --join_timeout comes with the remote flags
    add_pod_flags(parser)
    add_restart_flags(parser)
    add_replica_flags(parser)
    add_metrics_flags(parser)
    add_torchrun_flags(parser)
    return parser


def working_directory() -> str:
    """Where the ranks start (every node's agent changes to it): a directory removed under the shell that is
    still in it has no path left to give."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise XrunError("the working directory no longer exists (removed while this shell was in it); "
                        "cd to an existing directory") from None


def parse_request(argv: Sequence[str]) -> tuple[JobRequest, str | None]:
    parser = build_parser()
    split = split_argv(parser, argv)
    ns = parser.parse_args(list(split.options))
    if split.program is None:
        raise XrunError(f"missing SCRIPT to run; usage: {parser.usage}")
    pet = read_pet_defaults(parser, ns, split.options, os.environ)  # torchrun's PET_* flag defaults
    with blaming_pet(pet):  # a PET_* value refused below names its variable
        return _request(ns, split.program, split.program_args, split.options, pet=bool(pet))


def _request(ns: argparse.Namespace, program: str, program_args: tuple[str, ...], options: Sequence[str], *,
             pet: bool) -> tuple[JobRequest, str | None]:
    ns, torchrun = translate(ns, options, pet=pet)  # torchrun's flags as xrun's own (issue 41)
    for note in torchrun.notes:
        print(f"xrun: {note}", file=sys.stderr)
    num_gpus = resolve_nproc(ns.num_gpus, accelerators=count_accelerators() if isinstance(ns.num_gpus, str) else 0,
                             cpus=os.cpu_count() or 1)
    if ns.dry_run is not None and ns.dry_run not in DRY_RUN_FORMATS:
        raise UsageError("--dry-run", f"unknown format {ns.dry_run!r}; use --dry-run or --dry-run=json")
    for flag, addr in (("--master_addr", ns.master_addr), ("--control_addr", ns.control_addr)):
        problem = address_problem(addr) if addr is not None else None
        if problem:
            raise UsageError(flag, problem)
    if ns.master_port is not None and not 0 <= ns.master_port <= 65535:
        raise UsageError("--master_port", f"{ns.master_port} is not a TCP port (0..65535; 0 picks a free one)")
    request = JobRequest(
        script=program,
        args=program_args,
        hostfile=ns.hostfile,
        selection=Selection(include=ns.include, exclude=ns.exclude, num_nodes=ns.num_nodes, num_gpus=num_gpus),
        master_addr=ns.master_addr,
        master_port=DEFAULT_MASTER_PORT if ns.master_port is None else ns.master_port,  # None: a platform's may win
        master_port_choice=PortChoice.FREE if not ns.master_port else PortChoice.GIVEN,
        launcher=ns.launcher,
        launch=launch_options(ns, python=ns.python),
        options=replace(agent_options(ns), preload=preload_option(ns, program, os.environ)),
        run_id=ns.run_id or f"xrun-{os.urandom(4).hex()}",  # an id, not a secret: skip importing secrets
        remote=remote_options(ns),
        cwd=working_directory(),
        elastic=elastic_options(ns, static_restarts=True),
        pod=pod_request(ns),
        restart=restart_policy(ns),
        torchrun=torchrun,
        replicas=replica_request(ns),
        metrics=metrics_options(ns),
    )
    return request, ns.dry_run


def main(argv: Sequence[str] | None, in_process: InProcess) -> int:
    args = sys.argv[1:] if argv is None else argv
    tolerant_streams()
    raise_open_files_limit()  # before any socket or pipe: a large job must not die of the login's 1,024
    if args and args[0] == "check":
        # Lazy: xrun check's modules (the network check's, ~1.5 MiB of RSS) stay out of every run's head, and out
        # of what each rank's process inherits at fork (tests/test_summary.py measures its peak RSS).
        from xrun.runner.check import main as check_main

        return check_main(args[1:])
    if args and args[0] == "report":
        from xrun.runner.report.command import main as report_main  # lazy, as xrun check's

        return report_main(args[1:])
    try:
        request, dry_run = parse_request(args)
        plan = plan_job(request)
        backend = get_backend(plan.backend)
        if dry_run is not None:
            invocation = backend.render(plan)
            validate(plan, dry_run=True)
            print_plan(plan, invocation, dry_run)
            return 0
        validate(plan)
        return backend.execute(plan, in_process)
    except XrunError as err:
        print(f"xrun: {one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


def entry(in_process: InProcess) -> None:
    """Console-script entry: run, then leave without CPython's interpreter teardown (``posix.leave``).

    By the time main() returns every rank is gone and every file is closed; the interpreter's own teardown
    (module cleanup, collecting everything imported) would only add tens of milliseconds to the job's end.
    """
    leave(main(None, in_process))
