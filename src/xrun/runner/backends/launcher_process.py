"""One launcher process (pdsh, mpirun, mpiexec.hydra, srun) that carries every node's agent.

The agents' ranks' lines come over the control channel; the launcher's stdout and stderr carry only what an agent
or the launcher writes outside the nodes' consoles (xrun.runner.job.relay says what), relayed through the control
loop onto the job's console in whole lines. Its exit is seen through a pidfd in the control server's event loop.
Its stderr is read as it comes, because that is where a node that could not be reached is first told: hydra
prints ``ssh: connect to host node1 port 22: Connection refused`` and then waits for the proxy that will never
come, for as long as the start barrier lets it (issue 12). Such a line ends that node's session at once
(``session_ended``), with the launcher's own words as the reason; a line written later cannot, since the job
ignores session ends of connected nodes. ssh names the host as it connected to it, which is not always the
hostfile's spelling (``LaunchedHosts``: lowercased, the address it resolved, its config's HostName); Intel MPI's
hydra keeps ssh's words to itself and names the proxy it could not run. A line naming a host that is none of the
job's still ends the wait of every node not yet connected (issue 33 §3: hydra waited the whole ``--join_timeout``
when ssh spelled the host otherwise). Backends differ only in how the process and what it started are stopped
(``_stop``). An agent that announces its one-time key (pdsh: ``xrun.channel.announce``) does so on this stderr
too: the line is taken out and handed to the server. pdsh's lines that only echo the job's own stop (``ssh exited
with exit code 143``) are kept off the console (``xrun.runner.backends.echoes``).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from typing import IO, Any

from xrun.channel.announce import AnnouncementFilter
from xrun.runner.backends.echoes import EchoFilter
from xrun.runner.backends.routes import address_of, first_address
from xrun.runner.job.relay import StreamLines
from xrun.runner.plan import Plan
from xrun.runner.remote_options import SshSettings

# What OpenSSH and pdsh print when a node cannot be reached, each naming the host (group 1).
_UNREACHABLE = (
    re.compile(r"ssh: connect to host (\S+) port \d+: .+"),
    re.compile(r"ssh: Could not resolve hostname ([^\s:]+): .+"),
    re.compile(r"(?:\S+@)?([^\s:@]+): Permission denied \(.+"),
    re.compile(r"pdsh@\S+: ([^\s:]+): (?:ssh exited with exit code \d+|connect: .+|gethostbyname\(\) failed.*)"),
    # Intel MPI's hydra keeps ssh's own words to itself
    re.compile(r"\[mpiexec@\S+\] Error: Unable to run bstrap_proxy on (\S+) \(pid \d+, exit code \d+\)"),
)
_LINE_LIMIT = 4096  # bytes kept of a line being matched: a rank's endless line must not grow memory


def unreachable_host(line: str) -> str | None:
    """The host a launcher's stderr line says could not be reached, or None."""
    for pattern in _UNREACHABLE:
        match = pattern.fullmatch(line.strip())
        if match:
            return match.group(1)
    return None


class LaunchedHosts:
    """Which of the job's hosts a launcher's line names: the name as the hostfile spells it, else the same name
    in another case (OpenSSH lowercases it), else the same address (ssh prints the address it connected to, or
    its config's HostName). Resolved only here, on the way to a failure: each name once, each host's address
    once. None: none of the job's."""

    def __init__(self, hosts: Sequence[str], ssh: SshSettings) -> None:
        self.hosts = tuple(hosts)
        self.ssh = ssh
        self._named: dict[str, str | None] = {host: host for host in self.hosts}
        self._addresses: dict[str, str | None] | None = None

    @classmethod
    def of(cls, plan: Plan) -> LaunchedHosts:
        return cls(plan.agent_hosts, plan.request.remote.ssh)  # the hot spares' too: one unreachable is only lost

    def which(self, named: str) -> str | None:
        if named not in self._named:
            self._named[named] = self._find(named)
        return self._named[named]

    def _find(self, named: str) -> str | None:
        folded = named.casefold()
        for host in self.hosts:
            if host.casefold() == folded:
                return host
        address = first_address(named)
        if address is None:
            return None
        if self._addresses is None:
            self._addresses = {host: address_of(host, self.ssh) for host in self.hosts}
        return next((host for host, at in self._addresses.items() if at == address), None)


class LauncherProcess:
    def __init__(self, proc: subprocess.Popen[bytes], program: str, hosts: LaunchedHosts) -> None:
        self.proc = proc
        self.program = program
        self.hosts = hosts
        self.pidfd: int | None = None
        self.partial = b""
        self.out: StreamLines | None = None  # its stdout and stderr on the job's console, from ``register`` on
        self.err: StreamLines | None = None
        self.announcements = AnnouncementFilter()
        self.echoes: EchoFilter | None = None  # pdsh: its lines that only echo the job's stop are kept off

    def register(self, loop: Any) -> None:
        self.pidfd = os.pidfd_open(self.proc.pid)
        loop.add_reader(self.pidfd, lambda: self._exited(loop))
        self.out = StreamLines(loop.console, (self.program, 1), 1)
        self.err = StreamLines(loop.console, (self.program, 2), 2)
        # Non-blocking: the launcher's children (ssh, proxies) may hold the pipes open after it exits.
        if self.proc.stderr is not None:
            os.set_blocking(self.proc.stderr.fileno(), False)
            loop.add_reader(self.proc.stderr, lambda: self._relay(loop))
        if self.proc.stdout is not None:
            os.set_blocking(self.proc.stdout.fileno(), False)
            loop.add_reader(self.proc.stdout, lambda: self._relay_out(loop))

    def _relay_out(self, loop: Any) -> bool:
        """The launcher's stdout, onto the job's console."""
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdout is not None and self.out is not None
        try:
            chunk = os.read(stdout.fileno(), 1 << 20)
        except BlockingIOError:
            return False
        if not chunk:
            loop.remove_reader(stdout)
            self.out.flush()
            return False
        self.out.feed(chunk)
        return True

    def _relay(self, loop: Any) -> bool:
        """Copy what the launcher wrote to stderr; end the session of a node it says it cannot reach."""
        stderr: IO[bytes] | None = self.proc.stderr
        assert stderr is not None and self.err is not None
        try:
            chunk = os.read(stderr.fileno(), 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            loop.remove_reader(stderr)
            self.err.feed(self._console(self.announcements.flush(), loop, end=True))
            self.err.flush()
            return False
        shown, announced = self.announcements.feed(chunk)
        for node, key_hex in announced:  # pdsh's agents prove keys they announce here (xrun.channel.announce)
            loop.key_announced(node, key_hex)
        self.err.feed(self._console(shown, loop))
        *lines, rest = (self.partial + shown).split(b"\n")
        self.partial = rest[-_LINE_LIMIT:]
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            named = unreachable_host(line)
            if named is not None:
                host = self.hosts.which(named)  # None: every node not yet connected
                loop.session_ended(host, 255, f"{self.program}: {line.strip()}")
        return True

    def _console(self, data: bytes, loop: Any, *, end: bool = False) -> bytes:
        """What of the launcher's stderr the console shows: all, but pdsh's echoes of the job's own stop
        (xrun.runner.backends.echoes). The lines that end a node's wait are read from all of it."""
        if self.echoes is None:
            return data
        shown = self.echoes.feed(data, loop.stop_echoed)
        return shown + self.echoes.flush() if end else shown

    def _exited(self, loop: Any) -> None:
        assert self.pidfd is not None
        loop.remove_reader(self.pidfd)
        while self.proc.stderr is not None and self._relay(loop):  # its last words first
            pass
        while self.proc.stdout is not None and self._relay_out(loop):
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
        if self.out is not None and self.proc.stdout is not None and not self.proc.stdout.closed:
            self._drain_out()
            self.proc.stdout.close()
        if self.err is not None:  # before the report: its last words come first
            self.err.flush()

    def _drain_out(self) -> None:
        """What the launcher's stdout still holds (its readers are gone with the loop): onto the console."""
        assert self.out is not None and self.proc.stdout is not None
        for _ in range(64):  # bounded: a surviving writer may keep writing
            try:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            self.out.feed(chunk)
        self.out.flush()

    def _stop(self) -> None:
        """Stop the running launcher and everything it started on this machine."""
        raise NotImplementedError
