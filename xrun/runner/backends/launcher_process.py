"""One launcher process (pdsh, mpirun, mpiexec.hydra, srun) that carries every node's agent.

Its output goes straight to ours; its exit is seen through a pidfd in the control server's event loop. Backends
differ only in how the process and what it started are stopped (``_stop``).
"""

from __future__ import annotations

import os
import subprocess
from typing import Any


class LauncherProcess:
    def __init__(self, proc: subprocess.Popen[bytes], program: str) -> None:
        self.proc = proc
        self.program = program
        self.pidfd: int | None = None

    def register(self, loop: Any) -> None:
        self.pidfd = os.pidfd_open(self.proc.pid)
        loop.add_reader(self.pidfd, lambda: self._exited(loop))

    def _exited(self, loop: Any) -> None:
        assert self.pidfd is not None
        loop.remove_reader(self.pidfd)
        code = self.proc.wait()
        loop.session_ended(None, code, f"{self.program} exited with code {code}")

    def finished(self, lost: set[str]) -> bool:
        # One process for all nodes: with a node cut off it may wait for ssh's own timeout, so the server's
        # short linger decides instead, and terminate() ends it.
        return self.proc.poll() is not None

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self._stop()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def _stop(self) -> None:
        """Stop the running launcher and everything it started on this machine."""
        raise NotImplementedError
