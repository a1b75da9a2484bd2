"""``--launcher pdsh``: ``pdsh -S -R ssh -f FANOUT -N -w HOSTS 'PYTHON -u -m xrun.launch --connect=...
--fingerprint=... --node_rank=%n --token=announce'``.

pdsh replaces ``%n`` with each host's index in the ``-w`` list, which is given in world order (pdsh keeps the order
it is given; it does not sort). ``-S`` makes pdsh exit with the largest remote exit code, ``-N`` drops its ``host: ``
prefix (the ranks' lines come over the control channel; the head labels them). pdsh has no stdin for remote commands,
and every user of a node can read its command line, so nothing secret is on it: each agent makes a one-time key,
announces it on its stderr, which reaches the head over pdsh's ssh session (xrun.channel.announce), and proves it on
the channel; the head admits node K only with the key node K's own agent announced, once. ``--ssh_port``,
``--ssh_config`` and ``--ssh_accept_new_hosts`` reach OpenSSH through ``PDSH_SSH_ARGS_APPEND``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import Any

from xrun.errors import UsageError
from xrun.runner.backends import Invocation, NodeCommand, Traits
from xrun.runner.backends.base import InProcess
from xrun.runner.backends.channel import Endpoint, Endpoints, agent_connect_argv, one_endpoint, run_over_channel
from xrun.runner.backends.echoes import EchoFilter
from xrun.runner.backends.launcher_process import LaunchedHosts, LauncherProcess
from xrun.runner.backends.routes import control_address
from xrun.runner.plan import Plan
from xrun.runner.remote_options import RemoteOptions, openssh_args
from xrun.shell import render

TERMINATE_WAIT = 2.0


def remote_argv(plan: Plan, endpoint: Endpoint | None, node_rank: str = "%n") -> tuple[str, ...]:
    return agent_connect_argv(plan.request.launch.python, endpoint, node_rank, token_on_stdin=False)


def pdsh_argv(plan: Plan, endpoint: Endpoint | None = None) -> tuple[str, ...]:
    """Pure: the one local command that starts every agent."""
    hosts = ",".join(plan.agent_hosts)  # %n: the world's node ranks, then the hot spares' agent ids
    fanout = str(check_fanout(plan.request.remote.fanout, len(plan.agent_hosts)))
    # pdsh joins its trailing words into the remote shell command: hand it one ready-quoted string.
    return ("pdsh", "-S", "-R", "ssh", "-f", fanout, "-N", "-w", hosts, render(remote_argv(plan, endpoint)))


def check_fanout(fanout: int, nodes: int) -> int:
    """``pdsh -f``: every agent holds its ssh connection for the whole job, so a fan-out below the node count would
    leave the nodes past it waiting for a connection that never frees, and the barrier for them (issue 15)."""
    if fanout < nodes:
        raise UsageError("--fanout", f"{fanout} is below the job's {nodes} hosts: pdsh keeps one connection per host "
                         f"open for the whole job, so the hosts past the first {fanout} would never start; "
                         f"use --fanout {nodes} or more")
    return fanout


def ssh_args_append(remote: RemoteOptions) -> str:
    """Extra OpenSSH arguments for pdsh's ssh module (PDSH_SSH_ARGS_APPEND)."""
    return render(openssh_args(remote.ssh))


class PdshBackend:
    name = "pdsh"
    traits = Traits(uses_channel=True, spares=True)

    def render(self, plan: Plan) -> Invocation:
        commands = tuple(
            NodeCommand(host=host, argv=remote_argv(plan, None, str(agent)))
            for agent, host in enumerate(plan.agent_hosts)
        )
        note = f"started as: PDSH_SSH_ARGS_APPEND={ssh_args_append(plan.request.remote)!r} {render(pdsh_argv(plan))}"
        return Invocation(backend=self.name, commands=commands, note=note)

    def execute(self, plan: Plan, in_process: InProcess) -> int:
        pdsh = shutil.which("pdsh")
        if pdsh is None:
            raise UsageError("--launcher", "pdsh is not installed: apt-get install pdsh, or use --launcher ssh")
        hosts = list(plan.agent_hosts)
        # pdsh gives every node the same command, so every node connects to one address.
        addr = control_address(hosts, plan.request.remote)
        return run_over_channel(plan, dict.fromkeys(hosts, addr), lambda endpoints: self._start(pdsh, plan, endpoints),
                                announced_keys=True)

    def _start(self, pdsh: str, plan: Plan, endpoints: Endpoints) -> PdshSession:
        argv = (pdsh,) + pdsh_argv(plan, one_endpoint(plan, endpoints))[1:]
        env = dict(os.environ, PDSH_SSH_ARGS_APPEND=ssh_args_append(plan.request.remote))
        try:
            # Own session: a terminal's Ctrl-C reaches xrun only, which stops the nodes over the channel.
            # stderr through the control loop: its "ssh exited with exit code 255" ends that node's wait at once.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, start_new_session=True)
        except OSError as err:
            raise UsageError("--launcher", f"cannot run pdsh: {err.strerror}") from None
        return PdshSession(proc, LaunchedHosts.of(plan))


class PdshSession(LauncherProcess):
    def __init__(self, proc: subprocess.Popen[bytes], hosts: LaunchedHosts) -> None:
        super().__init__(proc, "pdsh", hosts)
        self.echoes = EchoFilter()  # "ssh exited with exit code 143" for each node xrun stopped: not news

    def finished(self, lost: set[str]) -> bool:
        """pdsh has exited, or all it still waits for is the ssh clients of lost nodes: a node cut off or frozen
        keeps its ssh open until TCP gives up, and the job would wait for the server's linger instead (3 s past
        the keepalive bound, where the ssh backend ends at once: it drops a lost host's session)."""
        if self.proc.poll() is not None:
            return True
        if not lost:
            return False
        import psutil

        try:
            clients = [child.cmdline() for child in psutil.Process(self.proc.pid).children()]
        except psutil.Error:  # pdsh exited meanwhile
            return self.proc.poll() is not None
        # pdsh's ssh module runs one `ssh ... HOST COMMAND` per host: the host is one of its words.
        return bool(clients) and all(lost.intersection(argv) for argv in clients)

    def _stop(self) -> None:
        """End pdsh and the ssh clients it forked (a node that is cut off keeps its ssh waiting for TCP)."""
        import psutil

        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            family = []
        # Our own child and its children, by pid (psutil guards against reuse): never by pattern.
        self.proc.send_signal(signal.SIGTERM)
        _signal_all(family, signal.SIGTERM)
        try:
            self.proc.wait(TERMINATE_WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _signal_all(family, signal.SIGKILL)


def _signal_all(processes: list[Any], signum: int) -> None:
    import psutil

    for process in processes:
        try:
            process.send_signal(signum)  # psutil checks the pid still names the same process
        except psutil.Error:
            pass
