"""What is left of a node's ranks once their main processes are gone (``Reaper.live``): the members of their sessions
that are still alive, and the rank descendants that left those sessions.

Every member of a rank's session descends from the rank, and as their child subreaper the agent inherits any whose
parent is gone: so while the agent has no child but the watchdog and the caller's own (the preload helper,
xrun.launch.preload), nothing of the ranks can be left, and the scan of
every process's ``/proc`` entry (about 1 ms here, tens of ms on a node running thousands of processes) is skipped.
A daemon (a double fork and ``setsid``) leaves its rank's session but not the job: it is one of the agent's children
that belongs to no rank's session and not to the agent's own (where its py-spy dumps run), and that was not the
caller's before the ranks started. Without the subreaper (not Linux) such orphans went to init, out of reach.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from xrun.launch.procs import proctable
from xrun.launch.procs.proctable import ProcInfo


class Survivors:
    """Finds what is left of the ranks; remembers the daemons it found (``escaped``) so that they are reaped."""

    def __init__(self) -> None:
        self._subreaper = False
        self._watchdog: int | None = None
        self._foreign: set[int] = set()
        self.escaped: set[int] = set()  # pids of rank descendants found outside every rank's session

    def attach(self, watchdog: int | None, *, subreaper: bool) -> None:
        """Before the first rank starts: the watchdog's pid, and whether this process is the ranks' subreaper."""
        self._watchdog, self._subreaper = watchdog, subreaper
        self._foreign = (proctable.children() or set()) - {watchdog}  # the caller's own: never a rank's

    def find(self, sids: Collection[int], running: Collection[int]) -> list[ProcInfo]:
        """The live members of the sessions ``sids`` and the live daemons that left them (``running``: the ranks'
        main processes not yet reaped, children of ours that are no leftovers)."""
        kids = proctable.children() if self._subreaper else None  # None: no list, or orphans went to init
        if kids is not None and kids - self._foreign <= {self._watchdog}:
            return []
        members = proctable.live_members(sids)
        return members + self._daemons(kids or set(), sids, {p.pid for p in members} | set(running))

    def _daemons(self, kids: set[int], sids: Collection[int], known: set[int]) -> list[ProcInfo]:
        own = os.getsid(0)
        found = [p for p in map(proctable.read_proc, kids - known - self._foreign - {self._watchdog})
                 if p is not None and p.alive and p.sid != own and p.sid not in sids]
        self.escaped.update(p.pid for p in found)
        return found
