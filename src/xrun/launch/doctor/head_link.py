"""The hang doctor's and telemetry's node half under a head (issue 38 §3): what the node's doctor
(xrun.launch.doctor.node_doctor) says goes to the head over the control channel, and what the head asks of it comes
back as the agent machine's actions, which the session driver (xrun.launch.session.driver) hands here by kind:

* ``TakeStacks`` (the head's ``dump``): the ranks' collective records, then their stacks, under the dump's id
  (``take_stacks``); under ``--elastic`` torch's agent owns the workers: an answer without stacks;
* ``StopRanks`` with ``stacks`` (another node failed first): the survivors' stacks before the stop
  (``stop_stacks``); at the attempt's end they go to the head before ``done`` (``report``); with ``hung`` (the
  head found the job hung): the ranks stopped as hung, with the stacks of the dump that found the hang
  (``stop_hung``);
* the doctor's link (``DoctorLink``): SIGQUIT asks the head for a job-wide dump (``want_stacks``), silence and
  speech (``quiet``, ``spoke``) are the head's hang watch's; the straggler samples (``entry_times``) and the ranks'
  usage go to the head as they are read.

The head half is ``xrun.runner.job.doctor_head`` (stacks, hangs) and ``xrun.runner.job.telemetry_head`` (samples,
usage). Every agent has a head, the stand-alone agent's too (a one-node job: xrun.joined.standalone).
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from xrun.channel import STOP_STACKS, Kind, Message, message

if TYPE_CHECKING:
    from xrun.common.result.outcome import NodeResult
    from xrun.launch.doctor.dumps import Diagnosis
    from xrun.launch.doctor.node_doctor import NodeDoctor


class HeadLink:
    """The doctor of the attempt that runs (``attach``), linked to the head through ``send``."""

    def __init__(self, send: Callable[[Message], None]) -> None:
        self.send = send
        self.doctor: NodeDoctor | None = None  # while an attempt's ranks run (None under --elastic)

    def attach(self, doctor: NodeDoctor | None) -> None:
        self.doctor = doctor
        if doctor is not None:
            doctor.link = self  # SIGQUIT, silence and speech go to the head, which sees every node
            doctor.send_samples = self.send  # the head scores the stragglers, across nodes (issue 31)
            doctor.send_usage = self.send  # the ranks' CPU and RSS, for the head's record (issue 40 §1)

    def take_stacks(self, dump_id: int | str) -> None:
        doctor = self.doctor
        if doctor is None:  # --elastic: torch's agent owns the workers
            self.send(message(Kind.STACKS, id=dump_id, stacks=[],
                              problem=f"no stacks from {socket.gethostname()}: not taken under --elastic"))
            return

        def answer(found: Diagnosis) -> None:
            if found.reading is not None:  # the ranks' collective records, the same id, first (issue 31)
                self.send(found.reading.message(dump_id))
            self.send(message(Kind.STACKS, id=dump_id, stacks=[s.to_json() for s in found.stacks],
                              problem=found.problem))

        doctor.dump(answer)

    def stop_hung(self, reason: str) -> bool:
        """The head found the job hung: the doctor stops the ranks as hung, the hang's dump in the node's report
        (False under --elastic: no doctor, the ranks are stopped as any stop does)."""
        if self.doctor is None:
            return False
        self.doctor.stop_hung(reason)
        return True

    def stop_stacks(self, signum: int) -> None:
        """Another node failed first: what were these doing? (Not before a SIGKILL: there is no time.)"""
        if self.doctor is not None and signum != signal.SIGKILL:
            self.doctor.take_stop_stacks()

    def report(self, result: NodeResult) -> None:
        """The attempt's end: the collective records and the stacks taken before the stop (the head merges every
        node's into its failure report), sent before ``done``. Not after a hang's stop: they are the hang's dump,
        which the head already showed and keeps for its report (the collective held at the hang)."""
        if result.hang is not None:
            return
        if result.collectives is not None:  # first: the stacks complete the node's answer (issue 31)
            self.send(result.collectives.message(STOP_STACKS))
        if result.stacks:
            self.send(message(Kind.STACKS, id=STOP_STACKS, stacks=[s.to_json() for s in result.stacks], problem=None))

    # -- the doctor's link (xrun.launch.doctor.node_doctor.DoctorLink) ------------------------------------------

    def stacks_wanted(self, reason: str) -> None:
        self.send(message(Kind.WANT_STACKS, reason=reason))

    def quiet(self, silent_for: float) -> None:
        self.send(message(Kind.QUIET, silent_for=round(silent_for, 3)))

    def spoke(self) -> None:
        self.send(message(Kind.SPOKE))
