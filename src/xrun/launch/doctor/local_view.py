"""The doctor's link of the stand-alone agent (``python -m xrun.launch --world_info=...``, xrun.launch.standalone),
which has no head: it shows the merged stacks and the collectives' findings itself and acts on a hang
(``--hang_action``). xrun.launch.doctor.node_doctor has the doctor, xrun.launch.doctor.dumps its dumps. Every other
agent (a job of several nodes, pod mode, the local run's one-node job: xrun.joined.one_node) has a head:
the driver is the link, and the head's doctor (xrun.runner.job.doctor) shows the view and decides the hang.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xrun.common.output.streams import notice
from xrun.common.spec import HangAction
from xrun.launch.doctor.node_doctor import NodeDoctor

if TYPE_CHECKING:  # the readers load at the first dump (xrun.launch.doctor.node_doctor), not at the view's start
    from xrun.launch.doctor.dumps import Diagnosis


class LocalView:
    """The link of a node that is the whole job: it shows the view itself and acts on a hang."""

    def __init__(self, doctor: NodeDoctor) -> None:
        self._doctor = doctor

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
        if action is not HangAction.DUMP:  # stop, or restart: with no head there is no attempt to retry
            self._doctor.stop_hung(f"{reason}; --hang_action {action.value}")

    def _show(self, found: Diagnosis, reason: str) -> None:
        # lazy: the views load with the first dump's readers, not at every local run's start (~12 ms of imports)
        from xrun.common.result.collectiveview import find_hang, view_lines
        from xrun.common.result.dumpfile import show_stacks

        host = self._doctor.host
        for line in show_stacks(found.stacks, found.problem, reason, log_dir=self._doctor.options.log_dir):
            notice(host, line)
        if found.reading is not None:  # the collective the ranks wait in, who never entered it (issue 31)
            for line in view_lines(find_hang(found.reading.collectives)):
                notice(host, line)
            notice(host, found.reading.line())
