"""The node agent's two command lines, rendered in one place: the wire between the runner and every node.

* Stand-alone: ``PYTHON -u -m xrun.launch --world_info=B64 --node_rank=K --master_addr=A ... -- SCRIPT ARGS``
  (``agent_argv``), what the local and ``--no_ssh`` backends show for the agent they run in-process and what a
  person may type. Its parser is ``xrun.common.agent_cli.parse_agent_argv``: ``parse_agent_argv(agent_argv(c)[4:])
  == c``.
* Connect mode: ``PYTHON -u -m xrun.launch --connect=ADDR:PORT --fingerprint=SHA256 --node_rank=K|--node_rank_from=VARS
  --token=-|env:NAME|announce`` (``connect_argv``), the tiny command every channel backend (ssh, pdsh, MPI, Slurm)
  starts once per node; everything else reaches the agent over the control channel. Nothing on it lets another user take
  the node's place: the fingerprint (of the head's certificate, which the agent pins) is public, and the token is read
  from stdin or the environment, or made by the agent and announced on its own output (pdsh). Its parser is
  ``xrun.launch.session.main.build_parser``; ``--connect`` comes first, which is how ``xrun.launch.__main__`` tells
  the modes apart. Before the runner's server is open (``--dry-run``) the endpoint and token are placeholders.

The runner builds these through this module only (``xrun.launch`` owns the wire; ``xrun.runner`` imports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xrun.channel.link import TOKEN_ENV_PREFIX
from xrun.common.rankplan import DEFAULT_ROLE, LaunchOptions, Rendezvous, World, encode_world_info, node_ranks
from xrun.common.rdzv import resolve_elastic
from xrun.common.spec import (
    DEFAULT_FORWARD_SIGNALS,
    DEFAULT_JOIN_TIMEOUT,
    DEFAULT_SHUTDOWN_TIMEOUT,
    AgentOptions,
    ElasticOptions,
    NodeSpec,
    PythonMode,
    filter_list,
    signal_list,
)

AGENT_MODULE = ("-u", "-m", "xrun.launch")  # after the interpreter: unbuffered, so output is never held back

# What --dry-run shows: the runner opens its control server only when the job really starts.
PLACEHOLDER_CONNECT = "HEAD_ADDR:PORT"
PLACEHOLDER_FINGERPRINT = "CERT_SHA256"


# ---------------------------------------------------------------------------------------------------------------
# Stand-alone form


@dataclass(frozen=True)
class AgentCommand:
    """Everything on a stand-alone agent command line, typed."""

    world: World
    node_rank: int
    rendezvous: Rendezvous
    launch: LaunchOptions
    options: AgentOptions
    script: str
    args: tuple[str, ...]
    elastic: ElasticOptions | None = None
    max_restarts: int = 0  # a static job's --max_restarts, its head's (with --elastic it is torch's, in ``elastic``)

    def node_spec(self) -> NodeSpec:
        host = list(self.world)[self.node_rank] if 0 <= self.node_rank < len(self.world) else "?"
        ranks = node_ranks(self.world, self.node_rank, self.rendezvous, self.launch, self.script, self.args,
                           max_restarts=self.max_restarts)
        return NodeSpec(
            host=host, node_rank=self.node_rank, ranks=ranks, options=self.options, run_id=self.rendezvous.run_id,
            elastic=resolve_elastic(self.elastic, self.world, self.rendezvous),
        )


def agent_argv(command: AgentCommand) -> tuple[str, ...]:
    """The agent command line for ``command``; ``parse_agent_argv(agent_argv(c)[4:])`` gives ``c`` back."""
    rdzv, launch, options = command.rendezvous, command.launch, command.options
    argv = [
        launch.python, *AGENT_MODULE,
        f"--world_info={encode_world_info(command.world)}",
        f"--node_rank={command.node_rank}",
        f"--master_addr={rdzv.known_master_addr}",
        f"--master_port={rdzv.master_port}",
        f"--run_id={rdzv.run_id}",
    ]
    argv += ["--no_local_rank"] if not launch.local_rank_arg else []
    argv += ["--device_per_rank"] if launch.device_per_rank else []
    argv += [f"--role={launch.role}"] if launch.role != DEFAULT_ROLE else []
    argv += ["--module"] if launch.mode is PythonMode.MODULE else []
    argv += ["--no_python"] if launch.mode is PythonMode.NONE else []
    argv += [f"--log_dir={options.log_dir}"] if options.log_dir is not None else []
    argv += ["--no_prefix"] if not options.prefix else []
    argv += ["--quiet"] if options.quiet else []
    argv += ["--no_dedupe"] if not options.dedupe else []
    if options.shutdown_timeout != DEFAULT_SHUTDOWN_TIMEOUT:
        argv += [f"--shutdown_timeout={options.shutdown_timeout:g}"]
    if options.duplicate_stdout_filters:
        argv += [f"--duplicate_stdout_filters={filter_list(options.duplicate_stdout_filters)}"]
    if options.duplicate_stderr_filters:
        argv += [f"--duplicate_stderr_filters={filter_list(options.duplicate_stderr_filters)}"]
    if options.numa_binding is not None:
        argv += [f"--numa_binding={options.numa_binding}"]
    else:
        argv += ["--bind_cores_to_rank"] if options.bind_cores else []
    argv += [f"--bind_core_list={options.bind_core_list}"] if options.bind_core_list is not None else []
    if options.console_ranks is not None:
        argv += [f"--console_ranks={','.join(str(r) for r in options.console_ranks)}"]
    if options.local_echo.ranks is not None:
        argv += [f"--local_ranks_filter={','.join(str(r) for r in options.local_echo.ranks)}"]
    redirects = options.local_echo.redirects_text()
    argv += [f"--redirects={redirects}"] if redirects is not None else []
    if options.forward_signals != DEFAULT_FORWARD_SIGNALS:
        argv += [f"--forward_signals={signal_list(options.forward_signals)}"]
    if options.hang_timeout is not None:
        argv += [f"--hang_timeout={options.hang_timeout!r}", f"--hang_action={options.hang_action.value}"]
    argv += ["--no_failure_stacks"] if not options.failure_stacks else []
    argv += [f"--network_interface={options.network_interface}"] if options.network_interface != "auto" else []
    argv += ["--no_telemetry"] if not options.telemetry else []
    argv += [f"--preload={','.join(options.preload)}"] if options.preload else []
    argv += [f"--max_restarts={command.max_restarts}"] if command.max_restarts else []
    argv += elastic_argv(command.elastic)
    return tuple(argv) + ("--", command.script) + command.args


def elastic_argv(elastic: ElasticOptions | None) -> list[str]:
    """``--elastic`` and the settings that differ from the parser's defaults."""
    if elastic is None:
        return []
    argv = ["--elastic"]
    argv += [f"--min_nodes={elastic.min_nodes}"] if elastic.min_nodes is not None else []
    argv += [f"--max_nodes={elastic.max_nodes}"] if elastic.max_nodes is not None else []
    argv += [f"--max_restarts={elastic.max_restarts}"] if elastic.max_restarts else []
    argv += [f"--rdzv_backend={elastic.rdzv_backend}"] if elastic.rdzv_backend != "c10d" else []
    argv += [f"--rdzv_endpoint={elastic.rdzv_endpoint}"] if elastic.rdzv_endpoint else []
    argv += [f"--rdzv_id={elastic.rdzv_id}"] if elastic.rdzv_id else []
    argv += [f"--rdzv_conf={k}={v}" for k, v in elastic.rdzv_conf.items()]
    argv += [f"--monitor_interval={elastic.monitor_interval:g}"] if elastic.monitor_interval != 0.1 else []
    argv += [f"--join_timeout={elastic.join_timeout:g}"] if elastic.join_timeout != DEFAULT_JOIN_TIMEOUT else []
    return argv


# ---------------------------------------------------------------------------------------------------------------
# Connect form


def connect_target(addr: str, port: int) -> str:
    """``--connect``'s value: ``HOST:PORT``, an IPv6 address in brackets (``connect.split_endpoint`` reads it)."""
    host = f"[{addr}]" if ":" in addr else addr
    return f"{host}:{port}"


def token_from_env(name: str) -> str:
    """``--token``'s value that makes the agent read the token from ``name`` (and drop it from its environment)."""
    return TOKEN_ENV_PREFIX + name


def connect_argv(
    python: str,
    *,
    connect: str | None,
    token: str,
    fingerprint: str | None,
    node_rank: int | str | None = None,
    node_rank_from: Sequence[str] = (),
) -> tuple[str, ...]:
    """The connect-mode agent command.

    ``connect`` is ``connect_target(addr, port)`` and ``fingerprint`` the head's certificate's (None for either
    renders --dry-run's placeholder); ``token`` is ``TOKEN_ON_STDIN``, ``token_from_env(NAME)`` or
    ``TOKEN_ANNOUNCE``. Exactly one of ``node_rank`` (a
    number, or pdsh's ``%n``) and ``node_rank_from`` (the engine's rank variables, the first one set wins).
    """
    if (node_rank is None) == (not node_rank_from):
        raise ValueError("connect_argv needs exactly one of node_rank and node_rank_from")
    rank = f"--node_rank={node_rank}" if node_rank is not None else f"--node_rank_from={','.join(node_rank_from)}"
    return (
        python, *AGENT_MODULE,
        f"--connect={PLACEHOLDER_CONNECT if connect is None else connect}",
        f"--fingerprint={PLACEHOLDER_FINGERPRINT if fingerprint is None else fingerprint}",
        rank,
        f"--token={token}",
    )
