"""The agent's side of whole-job restarts (``--max_restarts`` on a static job, issue 23).

After an attempt the agent has sent ``done`` and stays connected. The runner decides what follows once every node
is over (``xrun.runner.job.attempts``), and says it:

    restart(attempt) -> preflight again -> ready(master_port) [-> --precheck's probes] -> start -> run_node(...)
    -> done -> ...
    verdict, or the channel closing -> the agent ends with its last attempt's code

Node 0 checks the given ``--master_port`` again, or picks a fresh port, exactly as before the first start. A stop
between attempts is stale (the runner sent it to every node after the failure) and is skipped; one during the
next barrier ends that attempt on this node (``done``), and the agent waits for the runner's next word.

A hot spare (``--spares``) gets a ``spec`` marked ``standby`` first: it runs the same preflight, says ready and
waits connected, answering pings and ``--precheck``'s probes (``stand_by``). A second ``spec`` is a lost node's,
with this host: from then on the spare is that node (its attempt's number comes with the start). The verdict, or a
stop, ends it with 0.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from xrun import channel
from xrun.channel import Kind, message
from xrun.channel.link import Link
from xrun.errors import XrunError
from xrun.launch.agent import run_node
from xrun.launch.connect import ChannelHooks, node0_port, serve_until, use_spec, wait_for_start, with_rendezvous
from xrun.launch.network.answers import ProbeAnswers
from xrun.launch.preflight import check_spec, refusal
from xrun.launch.spec import NodeSpec

STOPPED = 128 + signal.SIGTERM  # told to stop before the attempt's ranks started


def next_attempts(hooks: ChannelHooks, spec: NodeSpec, code: int, *, near: str) -> int:
    """Run the attempts the runner asks for after the first; the last attempt's exit code."""
    while True:
        hooks.detach()
        restart = _next_of(hooks, (Kind.RESTART, Kind.VERDICT))
        if restart is None or restart.get("type") != Kind.RESTART.value:
            return code  # the job is over (a verdict), or the runner is gone
        ready = _ready(hooks, spec, restart, near=near)
        if ready is not None:
            return ready
        start = _wait_start(hooks)
        if start is None:
            return STOPPED
        if start.get("type") != Kind.START.value:
            # Stopped before the ranks started (another node failed its preflight, or was lost): this attempt is
            # over here, not the job; say so, and wait for the runner's word (a restart, maybe with a hot spare
            # in the other node's place, or the verdict).
            hooks.send(message(Kind.DONE, exit_code=STOPPED))
            code = STOPPED
            continue
        attempt = int(start.get("restart_count") or restart.get("attempt") or 0)
        code = run_node(with_rendezvous(spec, str(start["master_addr"]), int(start["master_port"]), attempt),
                        hooks=hooks)


def _ready(hooks: ChannelHooks, spec: NodeSpec, restart: dict[str, Any], *, near: str) -> int | None:
    """The preflight again, then ready (node 0: with the port it checked or picked); an exit code if it fails."""
    try:
        check_spec(spec)  # the node may have lost its script or log dir since: the runner names this host
        port = node0_port(spec.host, restart, near=near)
    except XrunError as err:
        hooks.send(refusal(err))
        return err.exit_code
    hooks.send(message(Kind.READY, master_port=port))
    return None


def _wait_start(hooks: ChannelHooks) -> dict[str, Any] | None:
    """The next start or stop (None: the channel is lost), answering --precheck's probes meanwhile: the runner
    checks the network again before every attempt (``xrun.launch.network.onchannel``, as ``serve_until`` does at
    the first barrier; here the channel's reader thread hands them over through the inbox)."""
    probes = ProbeAnswers(hooks.send)
    try:
        while True:
            msg = _next_of(hooks, (Kind.START, Kind.STOP, Kind.PROBE_OPEN, Kind.PROBE))
            if msg is None or msg.get("type") in (Kind.START.value, Kind.STOP.value):
                return msg
            probes.handle(msg)
    finally:
        probes.close()


def _next_of(hooks: ChannelHooks, kinds: tuple[Kind, ...]) -> dict[str, Any] | None:
    """The next message of ``kinds`` from the inbox; None once the channel is lost. Others are skipped: a stale
    stop, a dump or a signal meant for the attempt before has nothing left to act on."""
    wanted = {kind.value for kind in kinds}
    while True:
        msg = hooks.next_message(None)
        if msg is None or msg.get("type") in wanted:
            return msg


def after_barrier_stop(link: Link, spec: NodeSpec, *, near: str) -> dict[str, Any] | int:
    """Stopped at the first attempt's barrier (before the channel's reader thread exists): say ``done``, then, on the
    link itself, answer pings until the runner's restart (the preflight again, ready, the barrier: its start) or
    verdict (an exit code: the job is over)."""
    while True:
        link.send(message(Kind.DONE, exit_code=STOPPED))
        while True:
            msg = link.recv(timeout=channel.DEAD_AFTER)
            kind = msg.get("type")
            if kind == Kind.PING.value:
                link.send(message(Kind.PONG))
            elif kind == Kind.VERDICT.value:
                return STOPPED
            elif kind == Kind.RESTART.value:
                break  # a stale stop or anything else before it is skipped
        try:
            check_spec(spec)
            port = node0_port(spec.host, msg, near=near)  # a given --master_port taken on node 0
        except XrunError as err:  # the runner names this host and ends the job with its code (2)
            link.send(refusal(err))
            return err.exit_code
        link.send(message(Kind.READY, master_port=port))
        start = wait_for_start(link)
        if start is not None:
            return start


def stand_by(link: Link, first: dict[str, Any]) -> dict[str, Any] | int:
    """A hot spare: the preflight of the standby spec, ready, then the wait: the spec of the node whose place it
    takes, or an exit code (0: the job ended without it; the preflight's code when it failed)."""
    try:
        check_spec(use_spec(link, first))  # the same checks as any node's, before the spare counts as standing by
    except XrunError as err:  # the runner loses this spare, the job goes on
        link.send(refusal(err))
        return err.exit_code
    link.send(message(Kind.READY))
    # the runner pings spares too (silence is its loss), and --precheck checks them beside the nodes
    ends: dict[str, Callable[[dict[str, Any]], dict[str, Any] | int]] = {
        Kind.SPEC.value: lambda msg: msg, Kind.VERDICT.value: lambda msg: 0, Kind.STOP.value: lambda msg: 0}
    return serve_until(link, ends)
