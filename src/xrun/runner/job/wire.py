"""The wire as the job state machine (``xrun.runner.job.machine``) sees it: what the control server
(``xrun.runner.job.control_server``) makes of an agent's hello and messages, and the verdict it sends back.

A proven hello for a node rank of the world is a ``HelloReceived``; an admitted agent's ``ready``, ``rank_exited``,
``done``, ``error``, ``group_restarted``, ``group_failed`` and ``group_stopped`` are their events, any other kind
(``started``, ``pong``, a kind a newer agent added) is ``Heard``: it is alive. A malformed field is a protocol error
(``ChannelError``), which closes the connection it came on. The verdict goes back as a message (pod mode, restarts).
"""

from __future__ import annotations

from xrun.channel import ChannelError, Kind, Message, message
from xrun.channel.fields import PONG_FIELDS, fields_error
from xrun.common.result.group_restart import GroupRestart
from xrun.common.result.outcome import NODE_FAILURE_EXIT
from xrun.runner.job.events import (
    AgentError,
    Done,
    Event,
    GroupFailed,
    GroupRestarted,
    GroupStopped,
    Heard,
    HelloReceived,
    RankExited,
    Ready,
    Verdict,
)
from xrun.runner.job.last_words import headline


def hello_event(conn: int, peer: str, msg: Message, nodes: int) -> HelloReceived | None:
    """A well-formed hello for one of ``nodes`` as the machine's event (key unchecked); None otherwise."""
    rank = msg.get("node_rank")
    if msg.get("type") != Kind.HELLO.value or not isinstance(rank, int) or not 0 <= rank < nodes:
        return None
    versions = msg.get("versions")
    version = versions.get("xrun") if isinstance(versions, dict) else None
    addr = str(msg.get("addr") or peer)
    host = msg.get("host")
    return HelloReceived(rank, conn, addr=addr, peer=peer, xrun_version=version,
                         host=host if isinstance(host, str) and host else None)


def pong_clock(msg: Message) -> int | None:
    """A pong's node clock (ns; None: an agent that sends none); a malformed one is a ValueError."""
    problem = fields_error(msg, PONG_FIELDS)
    if problem is not None:
        raise ValueError(problem.reason)
    clock = msg.get("clock_ns")
    return clock if isinstance(clock, int) else None


def agent_event(node: int, msg: Message) -> Event:
    """An admitted agent's message as the machine's event; a malformed field is a protocol error."""
    kind = msg.get("type")
    if kind == Kind.READY.value:
        return Ready(node, master_port=_int(msg, "master_port"))
    if kind == Kind.RANK_EXITED.value:
        return RankExited(
            node, rank=_int(msg, "rank"), local_rank=_int(msg, "local_rank"), code=_int(msg, "code"),
            signal=_int(msg, "signal"), stopped=bool(msg.get("stopped")),
            tail=_lines(msg, "tail"),
        )
    if kind == Kind.DONE.value:
        return Done(node, exit_code=_int(msg, "exit_code") or 0)
    if kind == Kind.ERROR.value:
        return AgentError(node, str(msg.get("message")), _int(msg, "exit_code") or NODE_FAILURE_EXIT)
    if kind == Kind.GROUP_RESTARTED.value:  # --replica_groups: the record reads the rest (xrun.runner.replicas)
        return GroupRestarted(node, group=_int(msg, "group") or 0, restart=_int(msg, "restart") or 0)
    if kind == Kind.GROUP_FAILED.value:
        try:
            return GroupFailed(node, GroupRestart.from_json(dict(msg)))
        except ValueError as err:
            raise ChannelError(f"group_failed: {err}") from None
    if kind == Kind.GROUP_STOPPED.value:
        return GroupStopped(node, group=_int(msg, "group") or 0)
    return Heard(node)  # started, pong, or a kind a newer agent added: it is alive


def verdict_message(verdict: Verdict) -> Message:
    failure = verdict.failure
    return message(
        Kind.VERDICT, exit_code=verdict.exit_code, interrupted_by=verdict.interrupted_by,
        stopped_after=verdict.stopped_after, host=failure.host if failure else None,
        rank=failure.rank if failure else None, reason=failure.reason if failure else None,
        line=headline(verdict),  # pod mode: what every node but node 0 prints
    )


def _lines(msg: Message, key: str) -> tuple[str, ...]:
    value = msg.get(key) or []
    if not isinstance(value, list):
        raise ChannelError(f"{msg.get('type')}: {key} is {value!r}, not a list of lines")
    return tuple(str(line) for line in value)


def _int(msg: Message, key: str) -> int | None:
    value = msg.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ChannelError(f"{msg.get('type')}: {key} is {value!r}, not an integer")
