"""torch's side of ``--elastic``: the only module of xrun that imports torch (lazily, in ``import_torch``).

* ``import_torch``: the pieces of torch's public agent API that ``torch.distributed.launcher.api.launch_agent``
  assembles, or an XrunError naming what to install;
* ``rendezvous_handler`` / ``make_agent``: the rendezvous and a ``LocalElasticAgent`` subclass (``agent_class``)
  that tells xrun's attempt bookkeeping (xrun.launch.elastic.run) about each rendezvous, failure and restart, and
  lifts torch <= 2.3's fixed 300 s store barrier to ``--join_timeout``;
* ``raise_signal``: the signal handler that turns SIGTERM/SIGINT/SIGHUP into torch's ``SignalException``, so
  torch stops the workers against its own shutdown deadline;
* ``StopBridge``: what the control channel holds instead of a RankGroup (``add_reader``/``request_stop``) while
  torch's loop, not ours, runs the node;
* ``monitor_woken``: torch's monitor loop sleeps ``--monitor_interval`` between looks at the workers; a worker's
  exit (seen by xrun through its pidfd) ends that sleep, so the job's end is noticed at once whatever the
  interval (``--monitor_interval 1e3`` noticed it 1,000 s late: issue 33 §3), while a healthy group is still
  looked at (and asked for new nodes) only as often as the flag says.
"""

from __future__ import annotations

import inspect
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from xrun.common import rdzv
from xrun.common.output.streams import notice
from xrun.common.procs.signals import SHUTDOWN_SIGNALS, OwnedSignals
from xrun.common.spec import ElasticOptions, NodeSpec
from xrun.errors import XrunError

ROLE = "default"  # ROLE_NAME, as in xrun's static contract


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


def supported(callable_: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments this torch version accepts (newer ones are dropped, not passed blindly)."""
    params = inspect.signature(callable_).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def exit_barrier(t: Mapping[str, Any], options: ElasticOptions) -> float | None:
    """``--join_timeout`` as the agent's exit barrier, when this torch lets it be set (None: it does not)."""
    return supported(t["LocalElasticAgent"].__init__, {"exit_barrier_timeout": options.join_timeout}).get(
        "exit_barrier_timeout"
    )


def rendezvous_handler(t: Mapping[str, Any], options: ElasticOptions, node_rank: int) -> Any:
    params = t["RendezvousParameters"](
        backend=options.rdzv_backend,
        endpoint=options.rdzv_endpoint,
        run_id=options.rdzv_id,
        min_nodes=options.min_nodes,
        max_nodes=options.max_nodes,
        local_addr=None,
        **rdzv.rendezvous_configs(options, node_rank),
    )
    return t["registry"].get_rendezvous_handler(params)


def make_agent(t: Mapping[str, Any], spec: NodeSpec, workdir: str, handler: Any, node: Any) -> Any:
    """The agent for this node: torch starts ``/bin/sh WORKDIR/rank<L>.sh`` per local rank L, ``node`` hears of it."""
    options = spec.elastic
    assert options is not None and options.rdzv_endpoint
    master_addr = master_port = None
    if options.rdzv_backend == "static":  # the static store is the workers' MASTER_ADDR:MASTER_PORT too
        host, _, port = options.rdzv_endpoint.rpartition(":")
        master_addr, master_port = host.strip("[]"), int(port)
    worker_spec = t["api"].WorkerSpec(
        role=spec.ranks[0].env.get("ROLE_NAME", ROLE) if spec.ranks else ROLE,  # --role (torchrun's)
        local_world_size=len(spec.ranks),
        entrypoint="/bin/sh",
        args=(os.path.join(workdir, "rank${local_rank}.sh"),),  # torch substitutes ${local_rank}
        rdzv_handler=handler,
        max_restarts=options.max_restarts,
        monitor_interval=options.monitor_interval,
        master_addr=master_addr,
        master_port=master_port,
    )
    timeouts = {
        "exit_barrier_timeout": options.join_timeout,  # torch's default is 300 s, unreachable from torchrun's flags
        "shutdown_timeout": max(0, round(spec.options.shutdown_timeout)),
    }
    return agent_class(t, node)(
        spec=worker_spec,
        logs_specs=t["DefaultLogsSpecs"](log_dir=os.path.join(workdir, "torch")),
        start_method="spawn",
        **supported(t["LocalElasticAgent"].__init__, timeouts),
    )


def agent_class(t: Mapping[str, Any], node: Any) -> type:
    """LocalElasticAgent plus xrun's lines at each rendezvous and restart (and torch <= 2.3's 300 s barrier lifted).

    ``node`` is the attempt bookkeeping (xrun.launch.elastic.run): ``attempt_starting``, ``attempt_started``,
    ``failures``, ``restarting`` and ``options``.
    """
    api = t["api"]
    failed_states = (api.WorkerState.UNHEALTHY, api.WorkerState.FAILED)

    base: Any = t["LocalElasticAgent"]

    class XrunElasticAgent(base):  # type: ignore[misc]
        def _start_workers(self, worker_group: Any) -> dict[int, Any]:
            node.attempt_starting(worker_group)
            ids: dict[int, Any] = super()._start_workers(worker_group)
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


class _WakeableTime:
    """The ``time`` module as torch's agent module sees it, but for ``sleep`` (its monitor loop's, the only one
    there): that ends early once ``wake`` is set, which it then clears."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake

    def sleep(self, seconds: float) -> None:
        if self._wake.wait(seconds):  # a lock's wait: a signal's handler still runs, and its exception ends it
            self._wake.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@contextmanager
def monitor_woken(t: Mapping[str, Any], wake: threading.Event) -> Iterator[None]:
    """While torch's agent runs, a worker's exit (``wake`` set) cuts short the monitor loop's sleep. A torch whose
    agent module has no ``time`` of its own is left as it is (its loop then sleeps the whole interval)."""
    api = t["api"]
    if getattr(api, "time", None) is not time:
        yield
        return
    api.time = _WakeableTime(wake)
    try:
        yield
    finally:
        api.time = time


def raise_signal(exc_type: type, forward: Callable[[int], object] | None = None) -> Callable[[int, Any], None]:
    """A handler that raises torch's ``SignalException``, as torchrun's does: torch then stops the workers.
    ``forward`` takes the ``--forward_signals`` instead (passed on to the workers; torch's loop goes on)."""

    def handler(signum: int, _frame: Any) -> None:
        if forward is not None and signum not in SHUTDOWN_SIGNALS:
            forward(signum)
            return
        raise exc_type(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    return handler


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
            notice(self.host, f"{reason or 'stop requested'}; stopping the elastic agent")
            self._arm(signum)
        # SIGKILL cannot be caught: ask for the graceful stop, the shutdown deadline does the rest.
        os.kill(os.getpid(), signal.SIGTERM if signum == signal.SIGKILL else signum)

    def forward_signal(self, signum: int) -> None:
        """The control channel's ``signal``: raised in this process, whose handler passes it to the workers."""
        os.kill(os.getpid(), signum)

    def watch_signals(self, owned: OwnedSignals) -> None:
        """Our end of the wake-up pipe: a signal arms the fallback even while Python handlers cannot run."""

        def woken() -> None:
            stops = [s for s in owned.drain() if s in SHUTDOWN_SIGNALS]  # a forwarded SIGUSR1 stops nothing
            if stops:
                self._arm(stops[-1])

        self.add_reader(owned.wake_fd, woken)

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
        notice(self.host, f"the elastic agent did not stop within {self.grace + 5.0:g} s (blocked in torch); exiting")
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
