"""The hang doctor on one node: stacks on demand, the silence watch, and the survivors' stacks at a failure.

``NodeDoctor`` plugs into a RankGroup (xrun.launch.ranks.plugins ``Plugins``) before it runs:

* SIGQUIT (Ctrl-\\, as the JVM's thread dump) -> ``link.stacks_wanted``;
* a timer every ``min(1 s, timeout / 4)`` reads and clears the console's ``heard`` flag (no clock on the output
  path): after ``--hang_timeout`` seconds without output from any of the node's ranks -> ``link.quiet``, and
  the first output after that -> ``link.spoke``;
* at the first failure, before the others are stopped: their stacks within ``FAILURE_BUDGET`` seconds go into
  the node's result, so the failure report shows what they were doing (``--no_failure_stacks``: off);
* with telemetry (the default; xrun.launch.telemetry): every dump also reads the ranks' collective records while
  py-spy works, keeps the full records in a file on the node and hands the summaries on (``Diagnosis``); and a
  link that scores stragglers (the head's: ``on_samples``) gets every ``SAMPLE_EVERY`` seconds the ranks'
  entry times.

The link decides what a request means. Alone (xrun.launch.doctor.local_view: the local backend, a stand-alone
agent) this node is the whole job: the doctor takes the stacks, prints the merged view
(xrun.launch.result.stackview) and writes the full dumps to a file; a silence is the job's hang, and
``--hang_action stop`` stops it (exit code ``HANG_EXIT``). Under a head the link is the control channel
(xrun.launch.session.driver.Driver): a SIGQUIT asks the head for a job-wide dump, silence and speech are reported
to the head, which alone sees every node, and ``dump`` answers the head's request. Where no stack can be taken
(py-spy missing, no ptrace permission), one line says why and what to grant; the ranks never notice.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from xrun.launch.doctor.pyspy import EXITED, FAILURE_BUDGET, ON_DEMAND_BUDGET, pyspy_path, stack_problem
from xrun.launch.output.streams import notice
from xrun.launch.result.stacks import RankStack
from xrun.launch.result.stackview import full_text, merge, render
from xrun.launch.spec import AgentOptions
from xrun.launch.telemetry.reads import RankReads, Reading

if TYPE_CHECKING:
    from xrun.launch.doctor.background import InBackground
    from xrun.launch.ranks.supervise import DumpTarget, RankGroup
    from xrun.launch.result.outcome import RankOutcome
    from xrun.launch.telemetry.endpoints import Endpoints
    from xrun.launch.telemetry.records import EntryTimes

_CHECK_EVERY = 1.0  # at most: how late a silence (or the end of one) may be noticed
# the straggler sample (issue 31): a straggler is named once 3 in 4 of its last 16 scored collectives were late
# (xrun.launch.result.stragglers), 3 to 16 scored a sample (xrun.launch.telemetry.records.picked_per_sample): 10-40 s
# at this period; a sample costs each rank ~20 ms of one core (a dump of its 1,000 entries), 0.2 % at this period
SAMPLE_EVERY = 10.0
SAMPLE_BUDGET = 2.0  # a rank that has not answered by then sits this sample out


def until_the_next_sample(wall_now: float) -> float:
    """Seconds to the next multiple of ``SAMPLE_EVERY`` on the wall clock (at least half a period away): every
    node samples at about the same moment, so their ranks' Flight Recorders hold the same collectives even when a
    job enters more in a period than a buffer keeps (an FSDP job's hundreds a second)."""
    wait = SAMPLE_EVERY - wall_now % SAMPLE_EVERY
    return wait if wait >= SAMPLE_EVERY / 2 else wait + SAMPLE_EVERY


@dataclass(frozen=True)
class Diagnosis:
    """What a dump found: the ranks' stacks, or why there are none; their collective records (None: telemetry
    is off)."""

    stacks: Sequence[RankStack]
    problem: str | None
    reading: Reading | None = None


DumpDone = Callable[[Diagnosis], None]


class DoctorLink(Protocol):
    """Where a node's requests and silences go: this node itself (``LocalView``) or the head."""

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
        self._pyspy = pyspy_path(environ)
        self._reads = RankReads(host, endpoints, world_size) if endpoints is not None else None
        self._worker: InBackground | None = None  # dumps and samples: made at the first
        self._group: RankGroup | None = None
        self._watch: QuietWatch | None = None
        self._next_sample = 0.0
        self.on_samples: Callable[[list[EntryTimes]], None] | None = None  # a link that scores stragglers
        # this node itself when it is the whole job (xrun.launch.doctor.local_view), else the driver's link to the head
        self.link: DoctorLink | None = None

    def attach(self, group: RankGroup) -> None:
        self._group = group
        group.plugins.signals[signal.SIGQUIT] = lambda: self._link().stacks_wanted("SIGQUIT")
        if self.options.hang_timeout is not None:
            self._watch = QuietWatch(self.options.hang_timeout, time.monotonic())
            group.plugins.timers.add(lambda: self._watch.next_check if self._watch else None, self._check_quiet)
        if self.options.failure_stacks:
            group.plugins.before_failure_stop = self.take_stop_stacks
        if self._reads is not None:
            group.plugins.before_result = self._settle
            self._next_sample = time.monotonic() + until_the_next_sample(time.time())
            group.plugins.timers.add(lambda: self._next_sample if self.on_samples is not None else None, self._sample)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()

    @property
    def group(self) -> RankGroup:
        assert self._group is not None, "attach() first"
        return self._group

    def dump(self, on_done: DumpDone, *, budget: float = ON_DEMAND_BUDGET) -> None:
        """Take every live rank's stack (and collective records) in the background; ``on_done`` runs in the loop."""
        targets, ranks = self.group.live_targets(), self.group.ranks
        if not self._background().start(lambda: self._diagnose(targets, budget, ranks), on_done):
            notice(self.host, "a stack dump is already running; this request is dropped")

    def _background(self) -> InBackground:
        """The background worker, made and watched by the loop at the first dump or sample."""
        if self._worker is None:
            from xrun.launch.doctor.background import InBackground  # lazy: a run that never dumps makes no thread

            self._worker = InBackground("xrun-doctor")
            self.group.add_reader(self._worker, self._worker.ready)
        return self._worker

    def _diagnose(self, targets: Sequence[DumpTarget], budget: float, ranks: Sequence[int], *,
                  keep: bool = False) -> Diagnosis:
        """The stacks of the live ``targets`` with py-spy and, while its processes work, the collective records of
        every rank of the node (blocking): an ended rank's are those it left at its exit. ``keep``: the records'
        full answers are kept, not written yet (``_settle`` does, once the ranks have ended)."""
        reading: Reading | None = None

        def read() -> None:
            nonlocal reading
            if self._reads is not None and ranks:
                live = [t.rank for t in targets]
                found = self._reads.reading(live, budget, ended=[r for r in ranks if r not in live])
                reading = found if keep else self._written(found)

        problem = stack_problem(self.host, self._environ)
        if not targets:
            read()
            return Diagnosis([], problem, reading)
        if self._pyspy is None or problem is not None:
            read()
            return Diagnosis([], problem, reading)
        # Lazy: py-spy's runner (threads, subprocess parsing) is some 7 ms of the agent's imports
        # (python -X importtime); only a run that takes stacks loads it.
        from xrun.launch.doctor.stackdump import dump_ranks

        return Diagnosis(dump_ranks(self.host, targets, budget=budget, pyspy=self._pyspy, meanwhile=read), None,
                         reading)

    def _written(self, reading: Reading) -> Reading | None:
        """The ranks' records, their full answers written to a file on this node (and left out of the result);
        None when no rank had a process group: no collective to report (issue 37 §6)."""
        if not reading.grouped:
            return None
        if not reading.full:
            return reading
        text = json.dumps({"host": self.host, "ranks": {str(r): v for r, v in sorted(reading.full.items())}})
        try:
            return replace(reading, full={}, file=write_dump_file(self.options.log_dir, text, kind="collectives",
                                                                  suffix=".json"))
        except OSError as err:
            notice(self.host, f"the ranks' full collective records not written: {err.strerror or err}")
            return replace(reading, full={})

    def _sample(self) -> None:
        """Every ``SAMPLE_EVERY`` s: the ranks' entry times, in the background (a dump running: not this time)."""
        self._next_sample = time.monotonic() + until_the_next_sample(time.time())
        reads = self._reads
        if reads is None or self.group.stopping:
            return
        ranks = [t.rank for t in self.group.live_targets()]
        self._background().start(lambda: reads.sample(ranks, SAMPLE_BUDGET), self._sampled)

    def _sampled(self, samples: list[EntryTimes]) -> None:
        if samples and self.on_samples is not None and not self.group.stopping:
            self.on_samples(samples)

    def take_stop_stacks(self) -> None:
        """The live ranks' stacks (and collective records), now and within FAILURE_BUDGET (blocking: they are about
        to be stopped), kept for the failure report; once per run."""
        group = self.group
        if not self.options.failure_stacks or group.stacks or group.stopping:
            return
        targets = group.live_targets()
        found = self._diagnose(targets, FAILURE_BUDGET, group.ranks, keep=True)
        group.collectives = found.reading  # the ended ranks' too, what they left at their exit; settled at the end
        if not targets:
            return
        if found.problem is not None or self._pyspy is None:  # the report's view says why, in one line
            why = found.problem or "py-spy is missing"
            group.stacks = tuple(RankStack(self.host, t.rank, t.local_rank, t.pid, error=why) for t in targets)
            return
        # a rank that ended on its own meanwhile was not part of the failure: its missing stack is no news
        group.stacks = tuple(s for s in found.stacks if s.error != EXITED)

    def _settle(self, outcomes: Sequence[RankOutcome]) -> None:
        """Once every rank has ended: the failure's reading (taken before the stop, not written yet) with the last
        word of each rank that exited on its own, what it left at its exit, then written (issue 37 §2).

        When gloo's timeout fails every rank waiting in a collective at once, the agent reads them while they fail:
        one still answers, its collective retired by gloo as if done, one has just taken its socket away. What each
        left at its exit says which collective it died in (``records.with_failure``); a rank xrun stopped keeps
        what it said before the stop (where it was, not where the stop found it)."""
        reading, reads = self.group.collectives, self._reads
        if reading is None or reading.file is not None or reads is None:
            return
        ended = [o.rank for o in outcomes if o.started and not o.stopped_by_xrun]
        self.group.collectives = self._written(reads.settle(reading, ended))

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


def show_stacks(stacks: Sequence[RankStack], problem: str | None, reason: str, *, log_dir: str | None) -> list[str]:
    """The lines that show a dump: the headline naming the file with the full dumps, then the merged view.
    Writes that file (under ``log_dir``, else the working directory)."""
    if problem is not None:
        return [problem]
    if not stacks:
        return [f"{reason}: no rank is running, no stacks to take"]
    try:
        path = write_dump_file(log_dir, full_text(stacks, title=f"xrun: stacks of {len(stacks)} ranks ({reason})"))
        where = f"full dumps in {path}"
    except OSError as err:
        where = f"full dumps not written: {err.strerror or err}"
    lines = [f"{reason}: stacks of {len(stacks)} rank{'s' if len(stacks) != 1 else ''}, outliers first; {where}"]
    return lines + [f"  {line}" for line in render(merge(stacks))]


def write_dump_file(log_dir: str | None, text: str, *, kind: str = "stacks", suffix: str = ".txt") -> str:
    """``{log_dir or the temporary directory}/xrun-{kind}-YYYYmmdd-HHMMSS-<random>{suffix}``, mode 0600; returns its
    absolute path (the lines that announce it name it).

    Never the working directory: a job without ``--log_dir`` is not asked to leave files where it was started.
    Stacks and collective records show what the ranks hold (arguments, paths, tensor shapes): the file is
    readable by its owner only, and made with ``mkstemp`` (O_CREAT|O_EXCL|O_NOFOLLOW, a name nobody can guess
    ahead), so a link another user put in a shared directory such as ``/tmp`` is never followed (issue 22 §6)."""
    import tempfile  # lazy: it loads random and shutil, needed only when a dump is written

    directory = os.path.abspath(log_dir if log_dir is not None else tempfile.gettempdir())
    os.makedirs(directory, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())

    fd, path = tempfile.mkstemp(prefix=f"xrun-{kind}-{stamp}-", suffix=suffix, dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path
