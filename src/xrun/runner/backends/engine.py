"""What the MPI and Slurm backends share: the engine starts one agent per node, xrun does the rest.

An engine backend renders one local command, e.g. ``mpirun -np 3 --host a,b,c --map-by ppr:1:node ...
PYTHON -u -m xrun.launch --connect=HEAD:PORT --node_rank_from=OMPI_COMM_WORLD_RANK --token=env:XRUN_TOKEN``:

* the engine numbers its processes in the order of the host list we give it, so its own rank variable is the
  node rank (``--node_rank_from``); nothing per node is on the command line;
* the run token travels in the engine's environment and is exported *by name* (``-x XRUN_TOKEN``,
  ``-genvlist XRUN_TOKEN``, ``--export=ALL``): its value is in no argv on any machine, and the agent removes
  it from its environment before any rank starts;
* ranks, argv, env (``--export``, ``.xrun_env``, the travelling prefixes) and cwd reach each agent over the
  control channel (``xrun.runner.job.control_server``), byte-exact, as with ssh and pdsh; so do filters, per-rank logs,
  core binding and supervision, which are the agent's;
* teardown: the first failure stops every node over the channel; the engine's own abort (``mpirun`` on a
  non-zero exit, ``srun --kill-on-bad-exit=1``) is the second line; Ctrl-C reaches xrun only (the engine runs
  in its own session) and xrun stops the nodes, then the engine exits.

Subclasses override data (program names, rank variables) and one pure ``engine_args`` method; their
``traits`` (channel, engine: --launcher_args apply) are declared once, on ``EngineBackend``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from typing import Any, Callable

from xrun.common.command import connect_argv, token_from_env
from xrun.errors import UsageError
from xrun.parent_death import die_with_parent
from xrun.runner.backends import Invocation, NodeCommand, Traits
from xrun.runner.backends.base import InProcess
from xrun.runner.backends.channel import Endpoint, Endpoints, one_endpoint, run_over_channel
from xrun.runner.backends.launcher_process import LaunchedHosts, LauncherProcess
from xrun.runner.backends.routes import control_address
from xrun.runner.plan import Plan
from xrun.shell import render

TOKEN_ENV = "XRUN_TOKEN"  # noqa: S105 - the variable's name, not a token
TERMINATE_WAIT = 5.0  # srun and mpirun tear their step down on SIGTERM; give them a moment before SIGKILL

Which = Callable[[str], "str | None"]


def agent_argv(python: str, endpoint: Endpoint | None, rank_variables: Sequence[str]) -> tuple[str, ...]:
    """The agent command every engine process runs (identical on every node)."""
    return connect_argv(
        python,
        connect=endpoint.connect if endpoint is not None else None,
        fingerprint=endpoint.fingerprint if endpoint is not None else None,
        token=token_from_env(TOKEN_ENV),
        node_rank_from=rank_variables,
    )


def interface_args(plan: Plan, option: tuple[str, ...], given: str) -> tuple[str, ...]:
    """``option NAME`` for an explicit ``--network_interface NAME`` (issue 24), unless the user's
    ``--launcher_args`` already mention ``given``; ``auto``/``none`` add nothing (the head cannot know each
    node's interface name in advance)."""
    name = plan.request.options.network_interface
    if name in ("auto", "none") or any(given in arg for arg in plan.request.remote.launcher_args):
        return ()
    return (*option, name)


class EngineBackend:
    """Base class: one engine command for every node; see the module doc."""

    name = "engine"
    traits = Traits(uses_channel=True, engine=True)
    programs: tuple[str, ...] = ()  # candidates, first found on PATH wins (the first is shown when none is)
    rank_variables: tuple[str, ...] = ()  # the engine's per-process rank, in order of preference
    install_hint = ""

    def __init__(self, *, which: Which = shutil.which, environ: Any = None) -> None:
        self._which = which
        self._environ = os.environ if environ is None else environ

    # -- pure ------------------------------------------------------------------------------------------------

    def program(self) -> str:
        """The engine's executable as it will be run (a bare name: PATH decides, as in the user's shell)."""
        for name in self.programs:
            if self._which(name) is not None:
                return name
        return self.programs[0]

    def engine_args(self, plan: Plan) -> tuple[str, ...]:
        """The engine's own arguments (between the program and the agent command)."""
        raise NotImplementedError

    def withheld(self) -> tuple[str, ...]:
        """The names of our environment the engine is started without (none: it exports only what it is told)."""
        return ()

    def engine_env(self, token: str) -> dict[str, str]:
        """The engine's environment: the token first (MPICH 4.0's hydra never exports the last variable of its
        environment by name with -genvlist, measured on Debian 12), then ours less ``withheld()``."""
        skip = {TOKEN_ENV, *self.withheld()}
        return {TOKEN_ENV: token, **{k: v for k, v in self._environ.items() if k not in skip}}

    def started_as(self, plan: Plan) -> str:
        """The engine's command as a shell would run it, environment included (``--dry-run``'s note)."""
        unset = tuple(arg for name in self.withheld() for arg in ("-u", name))
        env = render(("env", *unset)) + " " if unset else ""
        return f"{env}{TOKEN_ENV}=<token> {render(self.engine_argv(plan))}"

    def engine_argv(self, plan: Plan, endpoint: Endpoint | None = None) -> tuple[str, ...]:
        return (
            (self.program(),)
            + self.engine_args(plan)
            + plan.request.remote.launcher_args
            + agent_argv(plan.request.launch.python, endpoint, self.rank_variables)
        )

    def render(self, plan: Plan) -> Invocation:
        agent = agent_argv(plan.request.launch.python, None, self.rank_variables)
        return Invocation(
            backend=self.name,
            commands=tuple(NodeCommand(host=node.host, argv=agent) for node in plan.nodes),
            note=f"started as: {self.started_as(plan)}",
        )

    # -- execution -------------------------------------------------------------------------------------------

    def execute(self, plan: Plan, in_process: InProcess) -> int:
        program = self.program()
        if self._which(program) is None:
            raise UsageError("--launcher", f"{self.name}: {program} not found on PATH; {self.install_hint}")
        hosts = [node.host for node in plan.nodes]
        # One engine command for every node, so every node connects to one address.
        addr = control_address(hosts, plan.request.remote)
        return run_over_channel(
            plan, dict.fromkeys(hosts, addr), lambda endpoints: self._start(program, plan, endpoints)
        )

    def _start(self, program: str, plan: Plan, endpoints: Endpoints) -> EngineSession:
        endpoint = one_endpoint(plan, endpoints)
        argv = self.engine_argv(plan, endpoint)
        env = self.engine_env(endpoint.token)
        # Parent-death signal: if xrun is SIGKILLed, the engine still ends (a pending srun would otherwise wait in
        # the queue and start agents with no runner to talk to).
        preexec = die_with_parent(signal.SIGTERM, os.getpid())
        try:
            # Own session: a terminal's Ctrl-C reaches xrun only, which stops the nodes over the channel.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, start_new_session=True,
                                    preexec_fn=preexec)  # noqa: PLW1509 - async-signal-safe calls only
        except OSError as err:
            raise UsageError("--launcher", f"cannot run {program}: {err.strerror}") from None
        return EngineSession(proc, program, LaunchedHosts.of(plan))


class EngineSession(LauncherProcess):
    def _stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own child's session, started above
            self.proc.wait(TERMINATE_WAIT)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


def host_list(plan: Plan) -> str:
    """The world's hosts in node-rank order: the engines number their processes in this order."""
    return ",".join(node.host for node in plan.nodes)
