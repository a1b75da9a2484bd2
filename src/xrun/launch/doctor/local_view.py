"""The link of a node that is the whole job (the local backend, a stand-alone agent): it shows the merged stacks
and the collectives' findings itself, acts on a hang (``--hang_action``) and scores its ranks' stragglers on one
clock (xrun.launch.doctor.node_doctor has the doctor, xrun.launch.doctor.dumps its dumps; under a head, the driver
is the link and the head compares).
"""

from __future__ import annotations

from xrun.common.output.streams import notice
from xrun.common.result.collectiveview import find_hang, view_lines
from xrun.common.result.dumpfile import show_stacks
from xrun.common.result.stragglers import SAME_CLOCK, StragglerScores
from xrun.common.spec import HangAction
from xrun.common.telemetry.records import EntryTimes
from xrun.launch.doctor.dumps import Diagnosis
from xrun.launch.doctor.node_doctor import NodeDoctor


class LocalView:
    """The link of a node that is the whole job: it shows the view itself and acts on a hang."""

    def __init__(self, doctor: NodeDoctor) -> None:
        self._doctor = doctor
        self._stragglers = StragglerScores()  # this node is the job: its ranks share one clock (issue 31)
        doctor.link = self
        doctor.on_samples = self._sampled
        doctor.group.stragglers = self._stragglers  # the scores go into the node's result, for the job's summary

    def _sampled(self, samples: list[EntryTimes]) -> None:
        for line in self._stragglers.add(self._doctor.host, SAME_CLOCK, samples):
            notice(self._doctor.host, line)

    def stacks_wanted(self, reason: str) -> None:
        self._doctor.dump(lambda found: self._show(found, reason))

    def quiet(self, silent_for: float) -> None:
        options = self._doctor.options
        reason = f"no rank wrote output for {silent_for:.0f} s (--hang_timeout {options.hang_timeout:g})"
        self._doctor.dump(lambda found: self._hung(found, reason))

    def spoke(self) -> None:
        notice(self._doctor.host, "output again after the silence; the hang watch is re-armed")

    def _hung(self, found: Diagnosis, reason: str) -> None:
        self._show(found, reason)
        action = self._doctor.options.hang_action
        if action is not HangAction.DUMP:  # stop, or restart (the local backend's attempts decide)
            self._doctor.group.stacks = tuple(found.stacks)
            self._doctor.group.collectives = found.reading
            self._doctor.group.stop_hung(f"{reason}; --hang_action {action.value}")

    def _show(self, found: Diagnosis, reason: str) -> None:
        host = self._doctor.host
        for line in show_stacks(found.stacks, found.problem, reason, log_dir=self._doctor.options.log_dir):
            notice(host, line)
        if found.reading is not None:  # the collective the ranks wait in, who never entered it (issue 31)
            for line in view_lines(find_hang(found.reading.collectives)):
                notice(host, line)
            notice(host, found.reading.line())
