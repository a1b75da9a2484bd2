"""One launcher process (pdsh, mpirun, mpiexec.hydra, srun) that carries every node's agent.

Its stdout goes straight to ours; its exit is seen through a pidfd in the control server's event loop. Its
stderr is relayed through that loop as it comes, because that is where a node that could not be reached is
first told: hydra prints ``ssh: connect to host node1 port 22: Connection refused`` and then waits for the
proxy that will never come, for as long as the start barrier lets it (issue 12). Such a line ends that
node's session at once (``session_ended``), with the launcher's own words as the reason; a line a rank
prints later cannot, since the job ignores session ends of connected nodes. Backends differ only in how the
process and what it started are stopped (``_stop``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import IO, Any

# What OpenSSH and pdsh print when a node cannot be reached, each naming the host (group 1).
_UNREACHABLE = (
    re.compile(r"ssh: connect to host (\S+) port \d+: .+"),
    re.compile(r"ssh: Could not resolve hostname ([^\s:]+): .+"),
    re.compile(r"(?:\S+@)?([^\s:@]+): Permission denied \(.+"),
    re.compile(r"pdsh@\S+: ([^\s:]+): (?:ssh exited with exit code \d+|connect: .+|gethostbyname\(\) failed.*)"),
)
_LINE_LIMIT = 4096  # bytes kept of a line being matched: a rank's endless line must not grow memory


def unreachable_host(line: str) -> str | None:
    """The host a launcher's stderr line says could not be reached, or None."""
    for pattern in _UNREACHABLE:
        match = pattern.fullmatch(line.strip())
        if match:
            return match.group(1)
    return None


def _write_all(data: bytes) -> None:
    sys.stderr.flush()
    fd = sys.stderr.fileno()
    while data:
        data = data[os.write(fd, data):]


class LauncherProcess:
    def __init__(self, proc: subprocess.Popen[bytes], program: str) -> None:
        self.proc = proc
        self.program = program
        self.pidfd: int | None = None
        self.partial = b""

    def register(self, loop: Any) -> None:
        self.pidfd = os.pidfd_open(self.proc.pid)
        loop.add_reader(self.pidfd, lambda: self._exited(loop))
        if self.proc.stderr is not None:
            # Non-blocking: the launcher's children (ssh, proxies) may hold the pipe open after it exits.
            os.set_blocking(self.proc.stderr.fileno(), False)
            loop.add_reader(self.proc.stderr, lambda: self._relay(loop))

    def _relay(self, loop: Any) -> bool:
        """Copy what the launcher wrote to stderr; end the session of a node it says it cannot reach."""
        stderr: IO[bytes] | None = self.proc.stderr
        assert stderr is not None
        try:
            chunk = os.read(stderr.fileno(), 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            loop.remove_reader(stderr)
            return False
        _write_all(chunk)
        *lines, rest = (self.partial + chunk).split(b"\n")
        self.partial = rest[-_LINE_LIMIT:]
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            host = unreachable_host(line)
            if host is not None:
                loop.session_ended(host, 255, f"{self.program}: {line.strip()}")
        return True

    def _exited(self, loop: Any) -> None:
        assert self.pidfd is not None
        loop.remove_reader(self.pidfd)
        while self.proc.stderr is not None and self._relay(loop):  # its last words first
            pass
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
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def _stop(self) -> None:
        """Stop the running launcher and everything it started on this machine."""
        raise NotImplementedError
