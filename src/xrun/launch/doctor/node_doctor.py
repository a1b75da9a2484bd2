"""The hang doctor on one node: stacks on demand, the silence watch, and the survivors' stacks at a failure.

``NodeDoctor`` plugs into a RankGroup (xrun.launch.ranks.plugins ``Plugins``) before it runs:

* SIGQUIT (Ctrl-\\, as the JVM's thread dump) -> ``link.stacks_wanted``;
* a timer every ``min(1 s, timeout / 4)`` reads and clears the console's ``heard`` flag (no clock on the output
  path): after ``--hang_timeout`` seconds without output from any of the node's ranks -> ``link.quiet``, and
  the first output after that -> ``link.spoke``;
* at the first failure, before the others are stopped: their stacks within ``FAILURE_BUDGET`` seconds go into
  the node's result, so the failure report shows what they were doing (``--no_failure_stacks``: off);
* with telemetry (the default; xrun.launch.telemetry): every dump also reads the ranks' collective records while
  py-spy works, keeps the full records in a file on the node and hands the summaries on (``Diagnosis``); and
  the head, which scores stragglers (a one-node job's too: xrun.joined.one_node), gets every
  ``SAMPLE_EVERY`` seconds the ranks' entry times as ``entry_times`` messages (``send_samples``);
* under a head (``send_usage``), every sample period of the head's record (xrun.common.telemetry.usage), each live
  rank's CPU and RSS read from ``/proc`` (xrun.launch.telemetry.usage) as one ``usage`` message, telemetry or not.

The link decides what a request means. Every agent has a head (a job of several nodes, pod mode, and a one-node
job: the local run and the stand-alone agent, xrun.joined) and the link is the control channel
(xrun.launch.doctor.head_link, the session driver's): a SIGQUIT asks the head for a job-wide dump, silence and
speech are reported to the head, which alone sees every node, shows the merged view (xrun.common.result.stackview)
and decides a hang, and ``dump`` answers the head's request; the head's hang stop comes back as ``stop_hung``,
which puts the stacks of the dump that found the hang in the node's report. Where no stack can be taken (py-spy
missing, no ptrace permission), one line says why and what to grant; the ranks never notice.

Every node agent loads this module at its start; what reads a rank (py-spy's runner, the Flight Recorder's records
parsed and summed up, the stacks as data and their merged view, the worker thread) is
``xrun.launch.doctor.dumps``, loaded at the first dump, sample or failure the doctor acts on, or ``READERS_AFTER``
of the ranks' own time (what they waited for a CPU left out) into a run with ``--failure_stacks``, so that a
failure's stop does not wait for the import (issue 38: nothing reads a rank before its first sample; a fan-out's
no-op ranks end before either, however busy the machine).
"""

from __future__ import annotations

import enum
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from xrun.common.spec import ON_DEMAND_BUDGET, AgentOptions
from xrun.common.telemetry.usage import sample_every, usage_message
from xrun.launch.procs.proctable import cpu_wait
from xrun.launch.telemetry.usage import UsageReader

if TYPE_CHECKING:
    from xrun.channel import Message
    from xrun.common.result.outcome import RankOutcome
    from xrun.launch.doctor.dumps import Diagnosis, DumpDone, NodeDumps
    from xrun.launch.ranks.supervise import RankGroup
    from xrun.launch.telemetry.endpoints import Endpoints

_CHECK_EVERY = 1.0  # at most: how late a silence (or the end of one) may be noticed
# the straggler sample (issue 31): a straggler is named once 3 in 4 of its last 16 scored collectives were late
# (xrun.common.result.stragglers), 3 to 16 scored a sample (xrun.common.telemetry.records.picked_per_sample): 10-40 s
# at this period; a sample costs each rank ~20 ms of one core (a dump of its 1,000 entries), 0.2 % at this period
SAMPLE_EVERY = 10.0
# A rank group that lived this long of its ranks' own time is a job, not a fan-out's no-op ranks: with
# --failure_stacks (the default) its readers are loaded then, in the loop's idle time, so that a failure's stop does
# not wait for their import (a connected agent's stop of the survivors, no py-spy, 15 paired rounds: 5.9 -> 26.6 ms
# median when they load at the failure); a job that ends sooner loads them only where it needs them (bench's
# failures: at 1 s). Own time leaves out what a rank waited for a CPU: on the namespace cluster's 2 cores a 32-host
# fan-out's no-op ranks were still starting half a wall-clock second in, and every agent loaded the readers (issue 38)
READERS_AFTER = 0.5


def until_the_next_sample(wall_now: float) -> float:
    """Seconds to the next multiple of ``SAMPLE_EVERY`` on the wall clock (at least half a period away): every
    node samples at about the same moment, so their ranks' Flight Recorders hold the same collectives even when a
    job enters more in a period than a buffer keeps (an FSDP job's hundreds a second)."""
    wait = SAMPLE_EVERY - wall_now % SAMPLE_EVERY
    return wait if wait >= SAMPLE_EVERY / 2 else wait + SAMPLE_EVERY


class DoctorLink(Protocol):
    """Where a node's requests and silences go: the head, over the session driver's channel (head_link); a Protocol
    because the driver sits above this folder (tests/test_layers.py's ranks)."""

    def stacks_wanted(self, reason: str) -> None:
        """SIGQUIT reached this node's agent."""

    def quiet(self, silent_for: float) -> None:
        """No rank of this node has written output for ``--hang_timeout`` seconds."""

    def spoke(self) -> None:
        """A rank wrote output again after ``quiet``."""


class Silence(enum.Enum):
    QUIET = "quiet"
    SPOKE = "spoke"


class QuietWatch:
    """When a node's ranks went quiet, and when they speak again: one report per silence."""

    def __init__(self, timeout: float, now: float) -> None:
        self.timeout = timeout
        self.interval = min(_CHECK_EVERY, timeout / 4)
        self.last_output = now  # at the granularity of the checks
        self.next_check = now + self.interval
        self.reported = False

    def check(self, now: float, heard: bool) -> Silence | None:
        """``heard``: some output since the last check. Returns what changed, if anything."""
        self.next_check = now + self.interval
        if heard:
            self.last_output = now
            if self.reported:
                self.reported = False
                return Silence.SPOKE
            return None
        if not self.reported and now - self.last_output >= self.timeout:
            self.reported = True
            return Silence.QUIET
        return None


class NodeDoctor:
    def __init__(self, host: str, options: AgentOptions, *, environ: Mapping[str, str] = os.environ,
                 endpoints: Endpoints | None = None, world_size: int = 1) -> None:
        self.host = host
        self.options = options
        self._environ = environ
        self._endpoints = endpoints  # None: no telemetry, no records read and no straggler sample
        self._world_size = world_size
        self._dumps: NodeDumps | None = None  # made at the first dump, sample or failure (``_hands``)
        self._group: RankGroup | None = None
        self._watch: QuietWatch | None = None
        self._next_sample = 0.0
        self._started = 0.0  # when the group's ranks started (attach: just before), for their own time
        self._readers_at = 0.0  # --failure_stacks: when their own time may first reach READERS_AFTER
        # the head scores the stragglers of the samples, which reach it as ``entry_times`` messages
        self.send_samples: Callable[[Message], None] | None = None
        # the head, for its record's samples: the ranks' CPU and RSS as ``usage`` messages (none without a head)
        self.send_usage: Callable[[Message], None] | None = None
        self._usage = UsageReader()
        self._usage_every = sample_every()
        self._next_usage = 0.0
        # the driver's link to the head (xrun.launch.doctor.head_link), set before the group runs
        self.link: DoctorLink | None = None
        self._last_found: Diagnosis | None = None

    def attach(self, group: RankGroup) -> None:
        self._group = group
        group.plugins.signals[signal.SIGQUIT] = lambda: self._link().stacks_wanted("SIGQUIT")
        if self.options.hang_timeout is not None:
            self._watch = QuietWatch(self.options.hang_timeout, time.monotonic())
            group.plugins.timers.add(lambda: self._watch.next_check if self._watch else None, self._check_quiet)
        if self.options.failure_stacks:
            group.plugins.before_failure_stop = self.take_stop_stacks
            self._started = time.monotonic()
            self._readers_at = self._started + READERS_AFTER
            group.plugins.timers.add(lambda: self._readers_at if self._dumps is None else None,
                                     self._ready_for_a_failure)
        self._next_usage = time.monotonic() + self._usage_every
        group.plugins.timers.add(lambda: self._next_usage if self.send_usage is not None else None, self._read_usage)
        if self._endpoints is not None:
            group.plugins.before_result = self._settle
            self._next_sample = time.monotonic() + until_the_next_sample(time.time())
            group.plugins.timers.add(lambda: self._next_sample if self._scored() else None, self._sample)

    def close(self) -> None:
        if self._dumps is not None:
            self._dumps.close()

    @property
    def group(self) -> RankGroup:
        assert self._group is not None, "attach() first"
        return self._group

    def dump(self, on_done: DumpDone, *, budget: float = ON_DEMAND_BUDGET) -> None:
        """Take every live rank's stack (and collective records) in the background; ``on_done`` runs in the loop."""

        def kept(found: Diagnosis) -> None:
            self._last_found = found  # a hang's stop, next, reports the stacks of the dump that found the hang
            on_done(found)

        self._hands().dump(kept, budget)

    def stop_hung(self, reason: str) -> None:
        """--hang_action stop|restart: the job is hung; stop the ranks as hung (HANG_EXIT, ``reason``), the stacks
        and collectives of the dump that found the hang in the node's report and ``failure.json``."""
        found, group = self._last_found, self.group
        if found is not None:
            group.stacks, group.collectives = tuple(found.stacks), found.reading
        group.stop_hung(reason)

    def _hands(self) -> NodeDumps:
        """What reads the ranks (xrun.launch.doctor.dumps), made at the first dump, sample or failure."""
        if self._dumps is None:
            # Lazy (issue 38): py-spy's runner, the records' parsing and summaries, the stacks as data and their
            # view, the worker thread: 12-17 ms of python -X importtime after the connected agent's own imports
            # (median of 11), which nothing needs before a rank's first sample, Ctrl-\, silence or failure.
            from xrun.launch.doctor.dumps import NodeDumps

            self._dumps = NodeDumps(self.host, self.options, self.group, environ=self._environ,
                                    endpoints=self._endpoints, world_size=self._world_size)
        return self._dumps

    def _ready_for_a_failure(self) -> None:
        """Once a live rank has lived ``READERS_AFTER`` of its own time: the readers, loaded before a failure's stop
        has to wait for them; else checked again when that could first be so."""
        own = self.own_time(time.monotonic())
        if own >= READERS_AFTER:
            self._hands()
        else:
            self._readers_at = time.monotonic() + READERS_AFTER - own

    def own_time(self, now: float) -> float:
        """The longest a live rank has run or slept since the group started, the time it waited for a CPU left out
        (0.0 with none alive: nothing to read)."""
        waits = [cpu_wait(t.pid) for t in self.group.live_targets()]
        return now - self._started - min(waits) if waits else 0.0

    def _scored(self) -> bool:
        return self.send_samples is not None

    def _sample(self) -> None:
        """Every ``SAMPLE_EVERY`` s: the ranks' entry times, in the background (a dump running: not this time)."""
        self._next_sample = time.monotonic() + until_the_next_sample(time.time())
        if self._endpoints is None or self.group.stopping:
            return
        ranks = [t.rank for t in self.group.live_targets()]
        if self.send_samples is not None:
            self._hands().sample(ranks, send=self.send_samples)

    def _read_usage(self) -> None:
        """Every sample period: the live ranks' CPU and RSS, one read of ``/proc`` each, in the loop (8 ranks:
        ~70 us a sample)."""
        self._next_usage = time.monotonic() + self._usage_every
        if self.send_usage is None or self.group.stopping:
            return
        readings = self._usage.read([(t.rank, t.pid) for t in self.group.live_targets()])
        if readings:
            self.send_usage(usage_message(readings))

    def take_stop_stacks(self) -> None:
        """The live ranks' stacks (and collective records), now and within FAILURE_BUDGET (blocking: they are about
        to be stopped), kept for the failure report; once per run."""
        group = self.group
        if not self.options.failure_stacks or group.stacks or group.stopping:
            return
        self._hands().stop_stacks()

    def _settle(self, outcomes: Sequence[RankOutcome]) -> None:
        """Once every rank has ended: the failure's reading, settled and written (``NodeDumps.settle``); nothing to
        do where no reading was taken."""
        if self.group.collectives is not None:
            self._hands().settle(outcomes)

    def _link(self) -> DoctorLink:
        assert self.link is not None, "a doctor's link is set before its group runs (xrun.launch.agent)"
        return self.link

    def _check_quiet(self) -> None:
        assert self._watch is not None
        console = self.group.console
        heard, console.heard = console.heard, False
        now = time.monotonic()
        change = self._watch.check(now, heard)
        if self.group.stopping:
            return
        if change is Silence.QUIET:
            self._link().quiet(now - self._watch.last_output)
        elif change is Silence.SPOKE:
            self._link().spoke()
