"""``--elastic``: a node's ranks under torch's ``LocalElasticAgent``. The only module of xrun that imports torch.

torch already does elastic training well (rendezvous, restarting the worker group, nodes leaving and joining),
so xrun hands the node over to it through its public agent API (``WorkerSpec`` + ``LocalElasticAgent``, the
pieces ``torch.distributed.launcher.api.launch_agent`` assembles) and keeps what it adds on top:

* env and argv: torch starts ``/bin/sh WORKDIR/rank<L>.sh`` for local rank L; the script adds xrun's
  variables to torch's (``CROSS_RANK``/``NODE_RANK`` = ``GROUP_RANK``, ``CROSS_SIZE``, ``LOCAL_SIZE``,
  ``CUDA_VISIBLE_DEVICES``, the binding's ``OMP_NUM_THREADS``), points stdout/stderr at the node's output
  relay and ``exec``s the planned argv (``--local_rank=L``, ``numactl``/``taskset`` binding, ``setpriv
  --pdeathsig`` so a ``kill -9``'d agent takes its ranks along). The worker torch supervises *is* the rank,
  as under torchrun, so a restart costs no extra interpreter and torch sees the real exit status;
* output: one relay thread reads every rank's FIFOs and writes complete lines with ``[host:RANK]`` (the rank
  of the current rendezvous) to the console and to per-rank log files (a restart's earlier files are kept,
  renamed with their time), keeping each stderr's tail for the report;
* ``--join_timeout`` becomes every start-up timeout of the torch found here (``xrun.launch.rdzv``) and the
  agent's exit barrier (300 s in torch, unreachable from torchrun's flags); the values are printed at start;
* one line per rendezvous and per restart, and at the end xrun's failure report of the last attempt with the
  real exit code of the rank that failed first (torchrun always exits 1);
* stop requests from the control channel and signals become torch's own ``SignalException``, so torch stops
  the workers against its shutdown deadline and leaves the rendezvous open for the other nodes.
"""

from __future__ import annotations

import errno
import inspect
import os
import re
import selectors
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from xrun.errors import XrunError
from xrun.launch import rdzv
from xrun.launch.binding import format_cpus
from xrun.launch.output import open_logs, prefix_lines
from xrun.launch.posix import signal_name, write_all
from xrun.launch.ranks import bind_ranks, rank_environment
from xrun.launch.result import NodeResult, RankOutcome, exit_code_of
from xrun.launch.spec import AgentOptions, ElasticOptions, NodeSpec
from xrun.shell import render

_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
ROLE = "default"  # ROLE_NAME, as in xrun's static contract
EXIT_RENDEZVOUS = 1  # the rendezvous failed (timed out, closed, store unreachable): no rank to blame
# torch >= 2.4 lets the workers share the rendezvous' TCPStore server across restarts without a per-attempt
# key prefix: a restarted group reads the previous attempt's gloo/NCCL addresses and fails to connect
# (torchrun 2.13 shows it too: its first restart fails). Opting out gives each attempt a fresh store.
TORCH_ENV_DEFAULTS = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
_CHUNK = 65536
_TAIL_BYTES = 16384
_TAIL_LINES = 20
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _notice(host: str, text: str) -> None:
    sys.stdout.flush()
    write_all(2, f"xrun[{host}]: {text}\n".encode("utf-8", "replace"))


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
) -> list[tuple[float, RankOutcome]]:
    """One attempt's ranks as (failure time, outcome): torch's failures failed on their own; the rest were stopped.

    ``failures`` maps global rank -> torch ``ProcessFailure`` (exitcode < 0 means the signal).
    """
    # torch SIGTERMs the rest of the group once one rank fails and reports them as failures too: those are
    # consequences, unless SIGTERM is all there is.
    own = {r: f for r, f in failures.items() if int(f.exitcode) != -signal.SIGTERM} or dict(failures)
    found = []
    for local_rank, rank in sorted(ranks.items()):
        failure = own.get(rank)
        if failure is not None and not stopped_all:
            code = int(failure.exitcode)
            when = float(getattr(failure, "timestamp", 0) or 0)
            outcome = RankOutcome(
                host=host, rank=rank, local_rank=local_rank, pid=int(failure.pid or pids.get(local_rank, 0)),
                returncode=code if code >= 0 else None, signal=-code if code < 0 else None, runtime_s=runtime_s,
                stderr_tail=tails.get(local_rank, ()), stopped_by_xrun=False,
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
    ordered = sorted((o for _, o in outcomes), key=lambda o: o.rank)
    failed = sorted(((when, o.rank), o) for when, o in outcomes if o.failed and not o.stopped_by_xrun)
    root = failed[0][1] if failed else None
    if root is not None:
        code = exit_code_of(root)
    elif interrupted_by is not None:
        code = 128 + interrupted_by
    elif any(o.failed for o in ordered):
        code = 1
    else:
        code = 0
    return NodeResult(
        host=host, outcomes=tuple(ordered), root_cause=root, interrupted_by=interrupted_by, exit_code=code
    )


def describe(outcome: RankOutcome) -> str:
    if outcome.signal is not None:
        return f"was killed by {signal_name(outcome.signal)}"
    return f"exited with code {outcome.returncode}"


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
# Output: the ranks write into FIFOs; one thread prefixes, logs and keeps tails.


class _Stream:
    __slots__ = ("fd", "console", "local_rank", "prefix", "pending", "log", "tail", "total")

    def __init__(self, fd: int, console: int, local_rank: int) -> None:
        self.fd = fd
        self.console = console
        self.local_rank = local_rank
        self.prefix = b""
        self.pending = b""
        self.log: int | None = None
        self.tail = b""
        self.total = 0

    def tail_lines(self) -> tuple[str, ...]:
        lines = self.tail.decode("utf-8", "replace").split("\n")
        if self.total > len(self.tail):
            lines = lines[1:]  # the first one was cut
        if lines and lines[-1] == "":
            lines.pop()
        return tuple(line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines[-_TAIL_LINES:])


class OutputRelay:
    """Two FIFOs per local rank, opened read-write here (so a rank's exit is never an EOF and restarts reuse
    them); complete lines get ``[host:RANK] `` and go to fd 1 / fd 2 and to ``log_dir/host/rankN/*.log``."""

    def __init__(self, host: str, workdir: str, local_ranks: int, options: AgentOptions) -> None:
        self.host = host
        self.options = options
        self.paths: dict[tuple[int, int], str] = {}
        self.streams: list[_Stream] = []
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._console_ok = {1: True, 2: True}
        for local_rank in range(local_ranks):
            for console, name in ((1, "out"), (2, "err")):
                path = os.path.join(workdir, f"{name}{local_rank}")
                os.mkfifo(path, 0o600)
                fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
                stream = _Stream(fd, console, local_rank)
                self.streams.append(stream)
                self.paths[(local_rank, console)] = path
                self._sel.register(fd, selectors.EVENT_READ, stream)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._loop, name="xrun-elastic-output", daemon=True)
        self._thread.start()

    def fifo(self, local_rank: int, console: int) -> str:
        return self.paths[(local_rank, console)]

    def new_attempt(self, ranks: Mapping[int, int]) -> None:
        """Before the workers of a rendezvous start: the rest of the last attempt's output keeps its prefix."""
        with self._lock:
            self._drain_locked()
            for stream in self.streams:
                self._end_attempt(stream)
            for local_rank, rank in ranks.items():
                logs = open_logs(self.options.log_dir, self.host, rank) if self.options.log_dir else None
                for stream in self.streams:
                    if stream.local_rank == local_rank:
                        stream.prefix = f"[{self.host}:{rank}] ".encode("utf-8", "surrogateescape")
                        stream.log = logs[stream.console - 1] if logs else None

    def tails(self) -> dict[int, tuple[str, ...]]:
        with self._lock:
            self._drain_locked()
            return {s.local_rank: s.tail_lines() for s in self.streams if s.console == 2}

    def close(self) -> None:
        with self._lock:
            self._drain_locked()
            for stream in self.streams:
                self._end_attempt(stream)
            self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2.0)
        for stream in self.streams:
            os.close(stream.fd)
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the thread -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            events = self._sel.select()
            with self._lock:
                if self._closed:
                    return
                for key, _ in events:
                    if key.data is None:
                        continue
                    self._read(key.data)

    def _read(self, stream: _Stream, limit: int = 16) -> None:
        for _ in range(limit):
            try:
                chunk = os.read(stream.fd, _CHUNK)
            except OSError as err:
                if err.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return
                raise
            if not chunk:
                return
            self._consume(stream, chunk)

    def _drain_locked(self) -> None:
        for stream in self.streams:
            self._read(stream, limit=1 << 20)

    def _consume(self, stream: _Stream, chunk: bytes) -> None:
        if stream.log is not None:
            write_all(stream.log, chunk)
        if stream.console == 2:
            stream.total += len(chunk)
            stream.tail = (stream.tail + chunk)[-_TAIL_BYTES:]
        if self.options.quiet or not self._console_ok[stream.console]:
            return
        if not self.options.prefix:
            self._emit(stream.console, chunk)
            return
        out, stream.pending = prefix_lines(stream.prefix, stream.pending, chunk)
        if out:
            self._emit(stream.console, out)

    def _end_attempt(self, stream: _Stream) -> None:
        if stream.pending and not self.options.quiet:
            self._emit(stream.console, stream.prefix + stream.pending + b"\n")
        stream.pending = b""
        if stream.log is not None:
            os.close(stream.log)
            stream.log = None
        stream.tail = b""
        stream.total = 0

    def _emit(self, fd: int, data: bytes) -> None:
        if self._console_ok[fd] and not write_all(fd, data):
            self._console_ok[fd] = False  # our reader went away (`| head`): keep logging, stop echoing


# ---------------------------------------------------------------------------------------------------------------
# The control channel's view of the agent (what ChannelHooks expects of a RankGroup).


class StopBridge:
    """``add_reader``/``request_stop`` for torch's agent loop, which is not ours to add readers to.

    Readers are watched by a daemon thread; a stop request signals this process, whose main thread then
    raises torch's ``SignalException`` wherever torch is (monitoring, rendezvous, exit barrier).
    """

    def __init__(self, host: str, *, grace: float = 30.0, cleanup: Callable[[], None] | None = None) -> None:
        self.host = host
        self.grace = grace
        self.cleanup = cleanup
        self.requested: int | None = None
        self._sel = selectors.DefaultSelector()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._armed = False

    def add_reader(self, fileobj: Any, callback: Callable[[], None]) -> None:
        self._sel.register(fileobj, selectors.EVENT_READ, callback)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="xrun-elastic-bridge", daemon=True)
            self._thread.start()

    def request_stop(self, signum: int = signal.SIGTERM, reason: str = "") -> None:
        if self.requested is None:
            self.requested = signum
            _notice(self.host, f"{reason or 'stop requested'}; stopping the elastic agent")
            self._arm(signum)
        # SIGKILL cannot be caught: ask for the graceful stop, the shutdown deadline does the rest.
        os.kill(os.getpid(), signal.SIGTERM if signum == signal.SIGKILL else signum)

    def watch_signals(self, wakeup_fd: int) -> None:
        """Our end of ``signal.set_wakeup_fd``: a signal arms the fallback even while Python handlers cannot run."""

        def woken() -> None:
            try:
                data = os.read(wakeup_fd, 64)
            except OSError:
                return
            if data:
                self._arm(data[-1])

        self.add_reader(wakeup_fd, woken)

    def _arm(self, signum: int) -> None:
        # torch may be inside a C++ store call (connecting to a rendezvous store that is not up yet, for up to
        # --join_timeout) where no Python signal handler runs; no worker runs then, so end the agent.
        if self._armed:
            return
        self._armed = True
        timer = threading.Timer(self.grace + 5.0, self._give_up, args=(signum,))
        timer.daemon = True
        timer.start()

    def _give_up(self, signum: int) -> None:
        if self._closed:
            return
        _notice(self.host, f"the elastic agent did not stop within {self.grace + 5.0:g} s (blocked in torch); exiting")
        if self.cleanup is not None:
            self.cleanup()
        os._exit(128 + signum)

    def close(self) -> None:
        self._closed = True
        for key in list(self._sel.get_map().values()):  # the owners close these fds after we return
            try:
                self._sel.unregister(key.fileobj)
            except (KeyError, ValueError):
                pass

    def _loop(self) -> None:
        while not self._closed:
            try:
                events = self._sel.select(0.5)
            except (OSError, ValueError):  # closed under us at the end
                return
            for key, _ in events:
                if not self._closed:
                    key.data()


# ---------------------------------------------------------------------------------------------------------------
# torch.


def import_torch() -> dict[str, Any]:
    try:
        import torch
        from torch.distributed.elastic.agent.server import api
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
        from torch.distributed.elastic.rendezvous import RendezvousParameters, registry
        from torch.distributed.elastic.rendezvous.api import RendezvousError
    except ImportError as err:
        raise XrunError(
            f"--elastic needs torch on every node ({err}); install it there: pip install 'xrun[elastic]'"
        ) from None
    return {
        "version": torch.__version__,
        "api": api,
        "LocalElasticAgent": LocalElasticAgent,
        "DefaultLogsSpecs": DefaultLogsSpecs,
        "SignalException": SignalException,
        "RendezvousParameters": RendezvousParameters,
        "registry": registry,
        "RendezvousError": RendezvousError,
    }


def _supported(callable_: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments this torch version accepts (newer ones are dropped, not passed blindly)."""
    params = inspect.signature(callable_).parameters
    return {k: v for k, v in kwargs.items() if k in params}


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

    def attempt_starting(self, group: Any) -> None:
        self.ranks = {w.local_rank: w.global_rank for w in group.workers}
        self.failures = {}
        self.relay.new_attempt(self.ranks)

    def attempt_started(self, group: Any, ids: Mapping[int, Any], restarts: int) -> None:
        self.pids = {int(k): int(v) for k, v in ids.items()}
        self.started = time.monotonic()
        ranks = sorted(self.ranks.values())
        world = group.workers[0].world_size if group.workers else 0
        span = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0]) if ranks else "-"
        _notice(
            self.spec.host,
            f"rendezvous complete: node {group.group_rank} of {group.group_world_size}, ranks {span} of {world} "
            f"(restart {restarts} of {self.options.max_restarts})",
        )

    def outcomes(self, *, stopped_all: bool, stop_signal: int = signal.SIGTERM) -> list[tuple[float, RankOutcome]]:
        return failure_outcomes(self.spec.host, self.ranks, self.pids, self.failures, self.relay.tails(),
                                time.monotonic() - self.started, stopped_all=stopped_all, stop_signal=stop_signal)

    def restarting(self, failed: bool, restarts: int, handler: Any) -> None:
        if not failed:
            waiting = handler.num_nodes_waiting()
            _notice(self.spec.host,
                    f"{waiting} node(s) waiting to join: re-rendezvous (membership changes use no restart)")
            return
        broken = [o for _, o in sorted(self.outcomes(stopped_all=False), key=lambda x: x[0]) if not o.stopped_by_xrun]
        what = "; ".join(f"rank {o.rank} (local {o.local_rank}) {describe(o)}" for o in broken[:4]) or "a rank failed"
        _notice(self.spec.host,
                f"{what}; restarting the worker group (restart {restarts} of {self.options.max_restarts})")


def agent_class(t: Mapping[str, Any], node: _NodeRun) -> type:
    """LocalElasticAgent plus xrun's lines at each rendezvous and restart (and torch <= 2.3's 300 s barrier lifted)."""
    api = t["api"]
    failed_states = (api.WorkerState.UNHEALTHY, api.WorkerState.FAILED)

    base: Any = t["LocalElasticAgent"]

    class XrunElasticAgent(base):  # type: ignore[misc]
        def _start_workers(self, worker_group: Any) -> dict[int, Any]:
            node.attempt_starting(worker_group)
            ids = super()._start_workers(worker_group)
            node.attempt_started(worker_group, ids, worker_group.spec.max_restarts - self._remaining_restarts)
            return ids

        def _monitor_workers(self, worker_group: Any) -> Any:
            result = super()._monitor_workers(worker_group)
            if result.state in failed_states:
                node.failures = dict(result.failures)
            return result

        def _restart_workers(self, worker_group: Any) -> None:
            restarts = worker_group.spec.max_restarts - self._remaining_restarts
            node.restarting(worker_group.state in failed_states, restarts, worker_group.spec.rdzv_handler)
            super()._restart_workers(worker_group)

        if hasattr(api.SimpleElasticAgent, "_share_and_gather"):  # torch <= 2.3: a fixed 300 s store barrier

            def _share_and_gather(self, *args: Any, **kwargs: Any) -> Any:
                store_util = api.store_util
                original = store_util.synchronize

                def synchronize(*a: Any, **kw: Any) -> Any:
                    kw["timeout"] = node.options.join_timeout
                    return original(*a, **kw)

                store_util.synchronize = synchronize
                try:
                    return super()._share_and_gather(*args, **kwargs)
                finally:
                    store_util.synchronize = original

    return XrunElasticAgent


def _raise_signal(exc_type: type) -> Callable[[int, Any], None]:
    def handler(signum: int, _frame: Any) -> None:
        raise exc_type(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    return handler


def write_rank_scripts(spec: NodeSpec, workdir: str, relay: OutputRelay) -> None:
    envs = [rank_environment(os.environ, spec, r) for r in spec.ranks]
    bound = bind_ranks(spec, envs[0] if envs else os.environ)
    taskset, setpriv = shutil.which("taskset"), shutil.which("setpriv")
    if any(b.cpus is not None for b in bound) and taskset is None:
        _notice(spec.host, "taskset not found: ranks run unbound (apt-get install numactl or util-linux)")
    for local_rank, (rank, b) in enumerate(zip(spec.ranks, bound)):
        env = {k: rank.env[k] for k in ("CUDA_VISIBLE_DEVICES",) if k in rank.env}
        env.update(b.extra_env)
        text = rank_script(b.argv, env, stdout=relay.fifo(local_rank, 1), stderr=relay.fifo(local_rank, 2),
                           cpus=b.cpus, taskset=taskset, setpriv=setpriv)
        with open(os.path.join(workdir, f"rank{local_rank}.sh"), "w", encoding="utf-8") as f:
            f.write(text)


def run_elastic(spec: NodeSpec, *, hooks: Any = None) -> int:
    """Run this node's share of an elastic job to the end; print the report; return the node's exit code."""
    from xrun.launch.report import format_failure_report, write_failure_json

    options = spec.elastic
    if options is None or options.min_nodes is None or options.max_nodes is None or not options.rdzv_endpoint:
        raise XrunError("internal: run_elastic needs a resolved ElasticOptions in the node spec")
    t = import_torch()
    workdir = tempfile.mkdtemp(prefix="xrun-elastic-")
    relay = OutputRelay(spec.host, workdir, len(spec.ranks), spec.options)
    node = _NodeRun(spec, relay)
    bridge = StopBridge(spec.host, grace=spec.options.shutdown_timeout,
                        cleanup=lambda: shutil.rmtree(workdir, ignore_errors=True))
    saved = {s: signal.getsignal(s) for s in _HANDLED}
    env_overrides = {**TORCH_ENV_DEFAULTS, **spec.env}  # the runner's exports reach the ranks through os.environ
    saved_env = {k: os.environ.get(k) for k in env_overrides}
    shutdown_rdzv = True
    handler = None
    wake_r, wake_w = os.pipe()
    saved_wakeup: int | None = None
    try:
        write_rank_scripts(spec, workdir, relay)
        for key, value in env_overrides.items():
            if key in spec.env or key not in os.environ:  # the user's own TORCH_* setting wins over our default
                os.environ[key] = value
        exit_barrier = _supported(t["LocalElasticAgent"].__init__, {"exit_barrier_timeout": options.join_timeout})
        _notice(spec.host, start_line(options, spec, t["version"], exit_barrier.get("exit_barrier_timeout")))
        for signum, previous in saved.items():
            if previous is signal.SIG_IGN and signum != signal.SIGTERM:
                continue  # nohup / background job: keep ignoring, as asked
            signal.signal(signum, _raise_signal(t["SignalException"]))
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        saved_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        bridge.watch_signals(wake_r)
        if hooks is not None:  # before the rendezvous handler: c10d connects to its store right away
            hooks.attach(bridge)
        params = t["RendezvousParameters"](
            backend=options.rdzv_backend,
            endpoint=options.rdzv_endpoint,
            run_id=options.rdzv_id,
            min_nodes=options.min_nodes,
            max_nodes=options.max_nodes,
            local_addr=None,
            **rdzv.rendezvous_configs(options, spec.node_rank),
        )
        handler = t["registry"].get_rendezvous_handler(params)
        master_addr = master_port = None
        if options.rdzv_backend == "static":  # the static store is the workers' MASTER_ADDR:MASTER_PORT too
            host, _, port = options.rdzv_endpoint.rpartition(":")
            master_addr, master_port = host.strip("[]"), int(port)
        worker_spec = t["api"].WorkerSpec(
            role=ROLE,
            local_world_size=len(spec.ranks),
            entrypoint="/bin/sh",
            args=(os.path.join(workdir, "rank${local_rank}.sh"),),  # torch substitutes ${local_rank}
            rdzv_handler=handler,
            max_restarts=options.max_restarts,
            monitor_interval=options.monitor_interval,
            master_addr=master_addr,
            master_port=master_port,
        )
        agent = agent_class(t, node)(
            spec=worker_spec,
            logs_specs=t["DefaultLogsSpecs"](log_dir=os.path.join(workdir, "torch")),
            start_method="spawn",
            **_supported(t["LocalElasticAgent"].__init__, {
                **exit_barrier, "shutdown_timeout": max(0, round(spec.options.shutdown_timeout)),
            }),
        )  # fmt: skip
        try:
            run_result = agent.run()
        except t["SignalException"] as err:
            shutdown_rdzv = False  # like torchrun: keep the rendezvous open for the other nodes
            interrupted = bridge.requested if bridge.requested not in (None, signal.SIGKILL) else int(err.sigval)
            # torch passes the signal it got on to the workers
            stopped = node.outcomes(stopped_all=True, stop_signal=int(err.sigval))
            result = attempt_result(spec.host, stopped, interrupted)
        else:
            failed = run_result.is_failed()
            if failed:
                node.failures = dict(run_result.failures)
            result = attempt_result(spec.host, node.outcomes(stopped_all=False), None) if failed else NodeResult(
                host=spec.host, outcomes=(), root_cause=None, interrupted_by=None, exit_code=0)
        finally:
            for signum, previous in saved.items():  # torch leaves its own handlers installed
                signal.signal(signum, previous)  # type: ignore[arg-type]
    except (t["RendezvousError"], RuntimeError, TimeoutError) as err:  # store timeouts are RuntimeErrors
        _notice(spec.host, f"rendezvous failed: {type(err).__name__}: {err}")
        result = NodeResult(
            host=spec.host, outcomes=(), root_cause=None, interrupted_by=None, exit_code=EXIT_RENDEZVOUS
        )
    finally:
        for signum, previous in saved.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        bridge.close()
        if saved_wakeup is not None:
            signal.set_wakeup_fd(saved_wakeup)
        os.close(wake_r)
        os.close(wake_w)
        relay.close()
        for key, old in saved_env.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        if handler is not None and shutdown_rdzv:
            try:
                handler.shutdown()
            except Exception:  # noqa: BLE001, S110 - closing the rendezvous is best effort; the result stands
                pass
        shutil.rmtree(workdir, ignore_errors=True)
    if result.root_cause is not None or result.interrupted_by is not None:
        sys.stderr.write(format_failure_report(result) + "\n")
        if spec.options.log_dir is not None:
            write_failure_json(os.path.join(spec.options.log_dir, spec.host, "failure.json"), result)
        if hooks is not None and result.root_cause is not None:
            hooks.on_rank_exit(result.root_cause)
    if hooks is not None:
        hooks.on_result(result)
    return result.exit_code
