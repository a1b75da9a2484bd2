"""``--elastic``: a node's ranks under torch's ``LocalElasticAgent``, with xrun's contract kept on top.

torch already does elastic training well (rendezvous, restarting the worker group, nodes leaving and joining),
so xrun hands the node over to it through its public agent API (the torch-facing code, and the only import of
torch, is xrun.launch.elastic.torch_agent) and keeps here what it adds on top:

* env and argv: torch starts ``/bin/sh WORKDIR/rank<L>.sh`` for local rank L; the script adds xrun's
  variables to torch's (``CROSS_RANK``/``NODE_RANK`` = ``GROUP_RANK``, ``CROSS_SIZE``, ``LOCAL_SIZE``,
  ``CUDA_VISIBLE_DEVICES``, the binding's ``OMP_NUM_THREADS``, from xrun.launch.ranks.processes), points
  stdout/stderr at the node's output relay and ``exec``s the planned argv (``--local_rank=L``, ``numactl``/``taskset``
  binding, ``setpriv --pdeathsig`` so a ``kill -9``'d agent takes its ranks along). The worker torch supervises *is* the
  rank, as under torchrun, so a restart costs no extra interpreter and torch sees the real exit status;
* output: ``OutputRelay`` owns two FIFOs per local rank and one thread that reads them; the lines go through the
  same ``xrun.common.output.streams.Console`` as the static path, with ``[host:RANK]`` (the rank of the current
  rendezvous) and new per-rank log files for each attempt (a restart's earlier files are kept, renamed with
  their time), keeping each stderr's tail for the report;
* ``--join_timeout`` becomes every start-up timeout of the torch found here (``xrun.common.rdzv``) and the
  agent's exit barrier (300 s in torch, unreachable from torchrun's flags); the values are printed at start,
  with what the rendezvous waits for (a node range waits ``last_call_timeout`` for more nodes);
* one line per rendezvous and per restart (``_NodeRun``, the attempt bookkeeping torch's agent reports into),
  and at the end a ``NodeResult`` of the last attempt (xrun.common.result.outcome), which the agent reports like the
  static path's, with the real exit code of the rank that failed first (torchrun always exits 1) and the
  exception it recorded in the ``TORCHELASTIC_ERROR_FILE`` torch's agent gave it (``ProcessFailure.error_file``);
* stop requests from the control channel and signals become torch's own ``SignalException``, so torch stops
  the workers against its shutdown deadline and leaves the rendezvous open for the other nodes; the
  ``--forward_signals`` (SIGUSR1/SIGUSR2) are passed on to the current attempt's workers instead.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from xrun.common import rdzv
from xrun.common.network.socket_ifname import VARIABLES as IFNAME_VARIABLES
from xrun.common.output.logfiles import FilteredLogs, open_logs
from xrun.common.output.streams import Console, RankStream, grow_pipe, notice
from xrun.common.procs.signals import SHUTDOWN_SIGNALS, owned_signals
from xrun.common.ranks.binding import format_cpus
from xrun.common.ranks.devices import VISIBILITY, detect_devices
from xrun.common.result.errorfile import read_error_file
from xrun.common.result.outcome import NodeResult, RankOutcome, describe, node_result
from xrun.common.spec import AgentOptions, ElasticOptions, NodeSpec
from xrun.errors import XrunError
from xrun.launch.elastic import torch_agent as elastic_agent
from xrun.launch.ranks.processes import bind_ranks, rank_environment, with_network
from xrun.launch.store.agent_store import USE_AGENT_STORE, AttemptStores
from xrun.shell import render

EXIT_RENDEZVOUS = 1  # the rendezvous failed (timed out, closed, store unreachable): no rank to blame
# torch >= 2.4 lets the workers share the rendezvous' TCPStore server across restarts without a per-attempt
# key prefix: a restarted group reads the previous attempt's gloo/NCCL addresses and fails to connect
# (torchrun 2.13 shows it too: its first restart fails). Opting out gives each round a fresh port on rank 0's node,
# where xrun's agent hosts a fresh store (AttemptStores) and tells the workers TORCHELASTIC_USE_AGENT_STORE=True.
TORCH_ENV_DEFAULTS = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# ---------------------------------------------------------------------------------------------------------------
# Pure pieces.


def rank_script(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    stdout: str,
    stderr: str,
    cpus: Iterable[int] | None = None,
    taskset: str | None = None,
    setpriv: str | None = None,
) -> str:
    """The ``/bin/sh`` script torch starts for one local rank: xrun's env on top of torch's, then exec."""
    lines = ["# xrun --elastic: torch's agent starts this for one local rank; it becomes the rank (exec)"]
    lines += [f"export {name}={_sh(value)}" for name, value in env.items() if _NAME.match(name)]
    lines.append('export NODE_RANK="$GROUP_RANK" CROSS_RANK="$GROUP_RANK" CROSS_SIZE="$GROUP_WORLD_SIZE" '
                 'LOCAL_SIZE="$LOCAL_WORLD_SIZE"')  # fmt: skip
    lines.append(f"exec </dev/null >{_sh(stdout)} 2>{_sh(stderr)}")
    command = list(argv)
    if cpus is not None and taskset is not None:  # no numactl: bind by affinity (memory is not bound)
        command = [taskset, "-c", format_cpus(cpus), *command]
    if setpriv is not None:  # PR_SET_PDEATHSIG survives exec: the rank gets SIGTERM if the agent dies
        command = [setpriv, "--pdeathsig", "TERM", "--", *command]
    lines.append("exec " + render(command))
    return "\n".join(lines) + "\n"


def _sh(word: str) -> str:
    return render([word])


def failure_outcomes(
    host: str,
    ranks: Mapping[int, int],
    pids: Mapping[int, int],
    failures: Mapping[int, Any],
    tails: Mapping[int, tuple[str, ...]],
    runtime_s: float,
    *,
    stopped_all: bool,
    stop_signal: int = signal.SIGTERM,
    exit_times: Mapping[int, float] | None = None,
) -> list[tuple[float, RankOutcome]]:
    """One attempt's ranks as (failure time, outcome): torch's failures failed on their own; the rest were stopped.

    ``failures`` maps global rank -> torch ``ProcessFailure`` (exitcode < 0 means the signal). ``exit_times``
    (local rank -> ``time.time()`` of its exit, seen through a pidfd) orders failures precisely; torch's own
    timestamps are whole seconds, so a peer that aborts in the same second would otherwise tie with the rank
    that really failed first and win by its lower rank number.
    """
    # torch SIGTERMs the rest of the group once one rank fails and reports them as failures too: those are
    # consequences, unless SIGTERM is all there is.
    own = {r: f for r, f in failures.items() if int(f.exitcode) != -signal.SIGTERM} or dict(failures)
    found = []
    for local_rank, rank in sorted(ranks.items()):
        failure = own.get(rank)
        if failure is not None and not stopped_all:
            code = int(failure.exitcode)
            seen = (exit_times or {}).get(local_rank)
            when = seen if seen is not None else float(getattr(failure, "timestamp", 0) or 0)
            outcome = RankOutcome(
                host=host, rank=rank, local_rank=local_rank, pid=int(failure.pid or pids.get(local_rank, 0)),
                returncode=code if code >= 0 else None, signal=-code if code < 0 else None, runtime_s=runtime_s,
                stderr_tail=tails.get(local_rank, ()), stopped_by_xrun=False,
                error=read_error_file(getattr(failure, "error_file", None)),  # torch's agent set the path
            )  # fmt: skip
        else:
            when = float("inf")
            outcome = RankOutcome(
                host=host, rank=rank, local_rank=local_rank, pid=pids.get(local_rank, 0), returncode=None,
                signal=stop_signal, runtime_s=runtime_s, stderr_tail=tails.get(local_rank, ()), stopped_by_xrun=True,
            )  # fmt: skip
        found.append((when, outcome))
    return found


def attempt_result(host: str, outcomes: list[tuple[float, RankOutcome]], interrupted_by: int | None) -> NodeResult:
    """One attempt's outcomes as a NodeResult: the failure that came first (on its own) is the root cause."""
    failed = sorted(((when, o.rank), o) for when, o in outcomes if o.failed and not o.stopped_by_xrun)
    root = failed[0][1] if failed else None
    return node_result(host, [o for _, o in outcomes], root, interrupted_by)


def start_line(options: ElasticOptions, spec: NodeSpec, torch_version: str, exit_barrier: float | None) -> str:
    timeouts = ", ".join(f"{k}={v} s" for k, v in rdzv.effective_timeouts(options, spec.node_rank).items())
    barrier = f"; exit barrier {rdzv.seconds(exit_barrier)} s" if exit_barrier is not None else ""
    return (
        f"elastic (torch {torch_version}): {len(spec.ranks)} rank(s) here, "
        f"nodes {options.min_nodes}..{options.max_nodes}, "
        f"max {options.max_restarts} restart(s), {options.rdzv_backend} rendezvous at {options.rdzv_endpoint} "
        f"id {options.rdzv_id}; start-up timeouts from --join_timeout {options.join_timeout:g}: {timeouts}{barrier}"
    )


# ---------------------------------------------------------------------------------------------------------------
# Output: the ranks write into FIFOs; one thread reads them through the node's Console.


class _ExitWatch:
    """A pidfd of one worker of the current attempt, watched by the relay's thread."""

    __slots__ = ("local_rank", "fd")

    def __init__(self, local_rank: int, fd: int) -> None:
        self.local_rank = local_rank
        self.fd = fd


class OutputRelay:
    """Two FIFOs per local rank, opened read-write here (so a rank's exit is never an EOF and restarts reuse
    them); a thread hands what they carry to a ``Console``, which prefixes, echoes, logs and keeps the tails."""

    def __init__(self, host: str, workdir: str, local_ranks: int, options: AgentOptions) -> None:
        self.host = host
        self.options = options
        self.paths: dict[tuple[int, int], str] = {}
        self.streams: dict[tuple[int, int], RankStream] = {}  # (local rank, console fd) -> its stream
        self._lock = threading.Lock()  # the thread reads while the main thread starts attempts and takes tails
        self._sel = selectors.DefaultSelector()
        shows = sum(1 for local_rank in range(local_ranks) if options.local_echo.shows(local_rank))
        merge = options.dedupe and shows > 1  # one rank has nobody to repeat it: no line is held
        self._console = Console(prefix=options.prefix, quiet=options.quiet, on_close=self._sel.unregister,
                                merge_as=host if merge else None, host=host,
                                ranks_shown=shows if options.console_ranks is None else None)
        # torchrun's duplicate filters: one node file per stream, appended to across attempts
        self._filtered = FilteredLogs(options.log_dir, host,
                                      (options.duplicate_stdout_filters, options.duplicate_stderr_filters))
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self.exit_times: dict[int, float] = {}  # local rank -> time.time() of its exit, this attempt
        self.worker_exited = threading.Event()  # wakes torch's monitor loop (torch_agent.monitor_woken)
        self._exit_watches: list[_ExitWatch] = []
        for local_rank in range(local_ranks):
            for console, name in ((1, "out"), (2, "err")):
                path = os.path.join(workdir, f"{name}{local_rank}")
                os.mkfifo(path, 0o600)
                fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
                grow_pipe(fd)
                stream = RankStream(fd, console, keep_tail=console == 2)
                stream.copy = self._filtered.copy(console)
                self.streams[(local_rank, console)] = stream
                self.paths[(local_rank, console)] = path
                self._sel.register(fd, selectors.EVENT_READ, stream)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._loop, name="xrun-elastic-output", daemon=True)
        self._thread.start()

    def watch_exits(self, pids: Mapping[int, int]) -> None:
        """Note when each worker of this attempt exits (a pidfd turns readable), to the microsecond."""
        with self._lock:
            for local_rank, pid in pids.items():
                try:
                    fd = os.pidfd_open(pid)
                except (AttributeError, OSError):  # gone already (or no pidfd): it exited before now
                    self.exit_times.setdefault(local_rank, time.time())
                    self.worker_exited.set()
                    continue
                watch = _ExitWatch(local_rank, fd)
                self._exit_watches.append(watch)
                self._sel.register(fd, selectors.EVENT_READ, watch)

    def fifo(self, local_rank: int, console: int) -> str:
        return self.paths[(local_rank, console)]

    def new_attempt(self, ranks: Mapping[int, int]) -> None:
        """Before the workers of a rendezvous start: the rest of the last attempt's output keeps its prefix."""
        with self._lock:
            self._drain_locked()
            for stream in self.streams.values():
                self._end_attempt(stream)
            self._forget_exits()
            for local_rank, rank in ranks.items():
                logs = open_logs(self.options.log_dir, self.host, rank) if self.options.log_dir else None
                for console in (1, 2):
                    stream = self.streams[(local_rank, console)]
                    stream.rank = rank
                    stream.echo = ((self.options.console_ranks is None or rank in self.options.console_ranks)
                                   and self.options.local_echo.echoes(local_rank, console))
                    stream.log = logs[console - 1] if logs else None

    def tails(self) -> dict[int, tuple[str, ...]]:
        with self._lock:
            self._drain_locked()
            return {local_rank: s.tail_lines() for (local_rank, console), s in self.streams.items() if console == 2}

    def close(self) -> None:
        with self._lock:
            self._drain_locked()
            for stream in self.streams.values():
                self._end_attempt(stream)
            self._forget_exits()
            self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2.0)
        self._console.written()  # before the report; a console that stopped reading costs at most its stall
        for stream in self.streams.values():
            stream.close_fd()
        self._filtered.close()
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _loop(self) -> None:
        while True:
            with self._lock:
                timeout = self._console.wait()  # de-duplicated lines due (the merger is the lock's too)
            events = self._sel.select(timeout)
            with self._lock:
                if self._closed:
                    return
                self._console.flush_due()
                for key, _ in events:
                    if isinstance(key.data, _ExitWatch):
                        self._exited(key.data)
                    elif key.data is not None and key.data.fd is not None:
                        self._console.drain(key.data, limit=16)
                self._console.show_progress()  # a progress bar's state that nothing followed within the settle
            self._console.settle()  # outside the lock: the main thread may take the tails meanwhile

    def _exited(self, watch: _ExitWatch) -> None:
        if watch not in self._exit_watches:
            return  # a stale event: the main thread forgot this attempt's watches between select() and the lock
        self.exit_times.setdefault(watch.local_rank, time.time())
        self._unwatch(watch)
        self.worker_exited.set()

    def _unwatch(self, watch: _ExitWatch) -> None:
        self._sel.unregister(watch.fd)
        os.close(watch.fd)
        self._exit_watches.remove(watch)

    def _forget_exits(self) -> None:
        for watch in list(self._exit_watches):
            self._unwatch(watch)
        self.exit_times = {}

    def _drain_locked(self) -> None:
        for stream in self.streams.values():
            self._console.drain(stream, limit=1 << 20)
        self._console.flush_held()

    def _end_attempt(self, stream: RankStream) -> None:
        self._console.end_line(stream)
        self._console.flush_held()
        stream.close_log()
        stream.clear_tail()


# ---------------------------------------------------------------------------------------------------------------
# The run.


class _NodeRun:
    """What the agent subclass reports into: the current attempt's ranks, pids and failures."""

    def __init__(self, spec: NodeSpec, relay: OutputRelay) -> None:
        assert spec.elastic is not None
        self.spec = spec
        self.options: ElasticOptions = spec.elastic
        self.relay = relay
        self.ranks: dict[int, int] = {}  # local rank -> global rank, this attempt
        self.pids: dict[int, int] = {}
        self.failures: dict[int, Any] = {}  # global rank -> torch ProcessFailure, this attempt
        self.started = time.monotonic()
        self.stores = AttemptStores(spec.host)  # the workers' store at MASTER_PORT, where this node hosts it

    def attempt_starting(self, group: Any) -> None:
        self.ranks = {w.local_rank: w.global_rank for w in group.workers}
        self.failures = {}
        # torch hosts the workers' store itself where it shares its own (static, or the user's
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0): xrun hosts it only where torch would leave it to rank 0
        self.stores.next_round(rank_0_here=group.group_rank == 0 and not group.spec.rdzv_handler.use_agent_store,
                               master_addr=str(group.master_addr), master_port=int(group.master_port))
        self.relay.new_attempt(self.ranks)

    def attempt_started(self, group: Any, ids: Mapping[int, Any], restarts: int) -> None:
        self.pids = {int(k): int(v) for k, v in ids.items()}
        self.relay.watch_exits(self.pids)
        self.started = time.monotonic()
        ranks = sorted(self.ranks.values())
        world = group.workers[0].world_size if group.workers else 0
        span = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0]) if ranks else "-"
        notice(
            self.spec.host,
            f"rendezvous complete: node {group.group_rank} of {group.group_world_size}, ranks {span} of {world} "
            f"(restart {restarts} of {self.options.max_restarts})",
        )

    def forward_signal(self, signum: int) -> None:
        """``--forward_signals``: to every worker of this attempt (its main process), the job goes on."""
        count = 0
        for pid in self.pids.values():
            try:
                os.kill(pid, signum)
                count += 1
            except ProcessLookupError:
                pass
        notice(self.spec.host, f"forwarded {signal.Signals(signum).name} to {count} rank{'s' if count != 1 else ''}")

    def outcomes(self, *, stopped_all: bool, stop_signal: int = signal.SIGTERM) -> list[tuple[float, RankOutcome]]:
        return failure_outcomes(self.spec.host, self.ranks, self.pids, self.failures, self.relay.tails(),
                                time.monotonic() - self.started, stopped_all=stopped_all, stop_signal=stop_signal,
                                exit_times=self.relay.exit_times)

    def restarting(self, failed: bool, restarts: int, handler: Any) -> None:
        if not failed:
            waiting = handler.num_nodes_waiting()
            notice(self.spec.host,
                   f"{waiting} node(s) waiting to join: re-rendezvous (membership changes use no restart)")
            return
        broken = [o for _, o in sorted(self.outcomes(stopped_all=False), key=lambda x: x[0]) if not o.stopped_by_xrun]
        what = "; ".join(f"rank {o.rank} (local {o.local_rank}) {describe(o)}" for o in broken[:4]) or "a rank failed"
        notice(self.spec.host,
               f"{what}; restarting the worker group (restart {restarts} of {self.options.max_restarts})")


def write_rank_scripts(spec: NodeSpec, workdir: str, relay: OutputRelay) -> None:
    """``WORKDIR/rank<L>.sh`` for every local rank L: the binding and the environment of the static path."""
    envs = with_network(spec, [rank_environment(os.environ, spec, r, detect_devices()) for r in spec.ranks])
    bound = bind_ranks(spec, envs[0] if envs else os.environ)
    taskset, setpriv = shutil.which("taskset"), shutil.which("setpriv")
    if any(b.cpus is not None for b in bound) and taskset is None:
        notice(spec.host, "taskset not found: ranks run unbound (apt-get install numactl or util-linux)")
    for local_rank, (merged, b) in enumerate(zip(envs, bound)):
        env = {k: merged[k] for k in VISIBILITY.values() if k in merged}  # the contract's, or the user's -1
        env.update(b.extra_env)
        env.update({k: merged[k] for k in IFNAME_VARIABLES if k in merged})  # --network_interface (issue 24)
        env[USE_AGENT_STORE] = "True"  # an agent hosts it: xrun's (AttemptStores) or torch's own where it shares one
        text = rank_script(b.argv, env, stdout=relay.fifo(local_rank, 1), stderr=relay.fifo(local_rank, 2),
                           cpus=b.cpus, taskset=taskset, setpriv=setpriv)
        with open(os.path.join(workdir, f"rank{local_rank}.sh"), "w", encoding="utf-8") as f:
            f.write(text)


@contextmanager
def _torch_environ(exports: Mapping[str, str]) -> Iterator[None]:
    """The runner's exports and xrun's TORCH_* defaults in ``os.environ`` (the ranks inherit it through torch)."""
    overrides = {**TORCH_ENV_DEFAULTS, **exports}
    saved = {k: os.environ.get(k) for k in overrides}
    for key, value in overrides.items():
        if key in exports or key not in os.environ:  # the user's own TORCH_* setting wins over our default
            os.environ[key] = value
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def run_elastic(spec: NodeSpec, *, hooks: Any) -> NodeResult:
    """Run this node's share of an elastic job to the end; return its result (the agent reports it). ``hooks``:
    the driver's (xrun.launch.agent.AgentHooks, above this folder: typed Any)."""
    options = spec.elastic
    if options is None or options.min_nodes is None or options.max_nodes is None or not options.rdzv_endpoint:
        raise XrunError("internal: run_elastic needs a resolved ElasticOptions in the node spec")
    t = elastic_agent.import_torch()
    workdir = tempfile.mkdtemp(prefix="xrun-elastic-")
    try:
        relay = OutputRelay(spec.host, workdir, len(spec.ranks), spec.options)
        try:
            write_rank_scripts(spec, workdir, relay)
            with _torch_environ(spec.env):
                result = _run_agent(t, spec, workdir, relay, hooks)
        finally:
            relay.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if result.root_cause is not None:
        hooks.on_rank_exit(result.root_cause)  # torch's loop reports no exit as it happens: the root cause now
    return result


def _run_agent(t: Mapping[str, Any], spec: NodeSpec, workdir: str, relay: OutputRelay, hooks: Any) -> NodeResult:
    """torch's agent under xrun's signal handlers, with the control channel's stop requests bridged in."""
    assert spec.elastic is not None
    node = _NodeRun(spec, relay)
    bridge = elastic_agent.StopBridge(
        spec.host, grace=spec.options.shutdown_timeout, cleanup=lambda: shutil.rmtree(workdir, ignore_errors=True)
    )
    notice(spec.host, start_line(spec.elastic, spec, t["version"], elastic_agent.exit_barrier(t, spec.elastic)))
    notice(spec.host, waiting_line(spec.elastic, spec.node_rank))
    handler = None
    stopped = False
    try:
        forwarded = sorted(spec.options.forward_signals)
        handler = elastic_agent.raise_signal(t["SignalException"], node.forward_signal)
        with owned_signals((*SHUTDOWN_SIGNALS, *forwarded), handler) as owned:
            try:
                bridge.watch_signals(owned)
                hooks.attach(bridge)  # before the rendezvous handler: c10d connects to its store right away
                handler = elastic_agent.rendezvous_handler(t, spec.elastic, spec.node_rank)
                result = _agent_result(t, elastic_agent.make_agent(t, spec, workdir, handler, node), node, bridge)
                stopped = result.interrupted_by is not None
            finally:
                bridge.close()
                node.stores.close()
    except (t["RendezvousError"], RuntimeError, TimeoutError) as err:  # store timeouts are RuntimeErrors
        said = str(err) or ("not every node joined within --join_timeout" if "Timeout" in type(err).__name__ else "")
        notice(spec.host, f"rendezvous failed: {type(err).__name__}{': ' + said if said else ''}")
        result = NodeResult(spec.host, outcomes=(), root_cause=None, interrupted_by=None, exit_code=EXIT_RENDEZVOUS)
    finally:
        if handler is not None and not stopped:  # like torchrun: a stopped node keeps it open for the others
            _close_rendezvous(handler)
    return result


def _agent_result(t: Mapping[str, Any], agent: Any, node: _NodeRun, bridge: elastic_agent.StopBridge) -> NodeResult:
    host = node.spec.host
    try:
        with elastic_agent.monitor_woken(t, node.relay.worker_exited):
            run_result = agent.run()
    except t["SignalException"] as err:
        interrupted = bridge.requested if bridge.requested not in (None, signal.SIGKILL) else int(err.sigval)
        # torch passes the signal it got on to the workers
        return attempt_result(host, node.outcomes(stopped_all=True, stop_signal=int(err.sigval)), interrupted)
    if not run_result.is_failed():
        return node_result(host, (), None, None)
    node.failures = dict(run_result.failures)
    return attempt_result(host, node.outcomes(stopped_all=False), None)


def waiting_line(options: ElasticOptions, node_rank: int) -> str:
    """What the rendezvous waits for before the first rank starts (it is silent meanwhile: issue 13)."""
    if options.min_nodes == options.max_nodes:
        return f"rendezvous: waiting for all {options.max_nodes} node(s) to join"
    last_call = rdzv.effective_timeouts(options, node_rank).get("last_call_timeout", "?")
    return (
        f"rendezvous: waiting for {options.min_nodes} to {options.max_nodes} nodes; once {options.min_nodes} "
        f"joined it waits {last_call} s more (last_call_timeout) for the others, then starts"
    )


def _close_rendezvous(handler: Any) -> None:
    try:
        handler.shutdown()
    except Exception:  # noqa: BLE001, S110 - closing the rendezvous is best effort; the result stands
        pass
