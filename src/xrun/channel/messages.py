"""The control channel's message kinds: what the runner and each node agent say to each other.

The agent (``xrun.launch.session``) and the servers (``xrun.runner.job.control_server``,
``xrun.runner.pod.node0_server``) both import this package; neither defines a message of its own.

Every connection is TLS 1.3 (``xrun.channel.tls``, ``tls_server``); inside it, before anything else
(``xrun.channel.handshake``):

Agent -> runner                                   Runner -> agent
  auth(client_nonce, node_rank)   the first frame  challenge(server_nonce[, server_proof])   the answer to auth;
                                                                          server_proof: pod mode, checked first
  hello(proof, node_rank, host, pid, addr,          spec(spec[, max_restarts])   after a valid hello (head mode)
        versions[, digest])                         accept                after a valid hello (pod mode)
  ready(master_port)                                waiting(ready, total, missing, elapsed)   pod mode's barrier
  started                                           start(master_addr, master_port[, restart_count])   the barrier
                                                    restart(attempt[, pick_master_port, master_port])
                                                          --max_restarts: after every node's done, the next
                                                          attempt (the agent says ready again; node 0: the port)
  rank_exited(rank, local_rank, code, signal,      stop(signal, deadline, reason)
              tail, figures)
  done(exit_code, root_cause, interrupted_by)       verdict(exit_code, host, rank, reason, interrupted_by,
  pong / error(message, exit_code)                          stopped_after, line)   pod mode, and head mode with
  group_restarted(group, restart, budget, rank,
    cause, at, others)   --replica_groups: a group
    stopped and starts again (its ranks' ends are
    not told one by one)
  group_failed(same fields)   a rank of a group     stop_group(group)     --replica_groups: stop the node's
    across nodes failed here: its ranks here stop   start_group(group, restart)   ranks of a group across
  group_stopped(group)   its ranks here are gone      nodes; start them again once every node's are gone
                                                            --max_restarts: how the job ended (no more attempts);
                                                            line: the root cause as node 0 reports it
  want_stacks(reason)   SIGQUIT reached an agent    ping
  stacks(id, stacks, problem)   answers dump        signal(signal)        --forward_signals: to every rank
    (id "stop": taken before a stop, sent before done)
  quiet(silent_for) / spoke   --hang_timeout        dump(id, reason)      take every live rank's stack
  lines(fd, host, lines)   its console's line       stop(..., stacks)     stacks: take them before stopping
      records while its ranks run, [[ranks, text], ...]: only the head (pod mode: node 0) renders and shows them
  probe_ready(address, port, interface, ...)        probe_open(toward)    --precheck, at the barrier: open the
                                                                          node's probe server (issue 24)
  probed(id, ok, latency_ms, throughput_mbs, error) probe(id, probe, mode, seconds, timeout)   probe a peer
  collectives(id, ranks[, file])   just before the
    stacks of the same id: each rank's collective
    record (issue 31)
  entry_times(ranks)   every 10 s while the ranks
    run: when they entered some collectives
  usage(ranks)   every sample period (60 s) while
    the ranks run: each one's CPU and RSS
  pong(clock_ns)   the agent's wall clock when the
    ping came: the head's measure of its offset
  (the records' format, bounds and readers:
   xrun.common.telemetry.records and .usage)

Nonces (32 random bytes) and proofs (HMAC-SHA256, ``xrun.channel.proof``) travel as 64 lowercase hex digits. Head
mode: the agent first checks the server certificate's fingerprint against the one it was given (``tls.pin_ok``).
Until the hello's proof checks out, the server reads with ``FrameReader.stranger()`` (64 KiB frames, strict text)
and checks field shapes (``xrun.channel.fields``); a connection that fails any check is closed without a word.
After it, an admitted node's ``lines`` are still checked record by record (``lines_of``: shapes and sizes,
``xrun.channel.fields.LINES_FIELDS``): a bad record is a protocol error that costs its own connection only.

Pod mode (``xrun.joined.pod``, ``xrun.launch.session.driver.run_pod_node``): node 0's xrun hosts the server;
both sides prove the key derived from the shared secret (the server first, in the challenge) and ``digest`` is the
node's plan digest; no spec is ever sent, and every node exits with the code its ``verdict`` carries.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from xrun.channel.fields import LINE_RECORDS, LINES_FIELDS, LINES_TEXT, fields_error, record_problem
from xrun.channel.framing import ChannelError, Message

# A feature's reader of one kind of an agent's message at the head (issue 38 §3): the sender's node, the message,
# the head's monotonic now. A malformed field raises ValueError (or ChannelError): the sender's protocol error.
Reader = Callable[[int, Message, float], None]


class Kind(str, enum.Enum):
    """Every message type on the wire (the ``"type"`` field)."""

    AUTH = "auth"  # the client's first frame: its nonce and the node rank it will prove
    CHALLENGE = "challenge"  # the server's nonce (and, pod mode, its own proof)
    HELLO = "hello"
    SPEC = "spec"
    READY = "ready"
    START = "start"
    STARTED = "started"
    RANK_EXITED = "rank_exited"
    DONE = "done"
    STOP = "stop"
    PING = "ping"
    PONG = "pong"
    ERROR = "error"
    ACCEPT = "accept"  # pod mode: the hello's key and plan digest match node 0's
    WAITING = "waiting"  # pod mode: the barrier's status, for every node's console
    VERDICT = "verdict"  # pod mode: the job's exit code and root cause, once every node is over
    SIGNAL = "signal"  # --forward_signals: pass this signal on to every rank; the job goes on
    DUMP = "dump"  # the hang doctor (issue 14): take every live rank's stack, answer with stacks
    STACKS = "stacks"  # a node's answer to dump: its ranks' stacks, or the problem that prevents them
    WANT_STACKS = "want_stacks"  # SIGQUIT reached an agent (pod mode: any node's xrun): dump the whole job
    QUIET = "quiet"  # --hang_timeout: none of this node's ranks has written output for that long
    SPOKE = "spoke"  # the first output after quiet
    LINES = "lines"  # a node's console: its ranks' line records and its own lines, for the head's console
    RESTART = "restart"  # --max_restarts: every node is done with an attempt; prepare the next and say ready
    PROBE_OPEN = "probe_open"  # --precheck (issue 24): open this node's probe server, say where it listens
    PROBE_READY = "probe_ready"  # the answer: address, port and interface toward the master
    PROBE = "probe"  # --precheck: probe a peer's server (id, probe ADDR:PORT, mode, seconds, timeout)
    PROBED = "probed"  # the answer: id and the measurement (ok, latency_ms, throughput_mbs, error)
    COLLECTIVES = "collectives"  # beside stacks, the same id: each rank's collective record and the node's file
    ENTRY_TIMES = "entry_times"  # the straggler sample: when each rank entered some collectives (issue 31)
    USAGE = "usage"  # each live rank's CPU share and RSS over the last sample period (issue 40 §1)
    GROUP_RESTARTED = "group_restarted"  # --replica_groups: a group of the node's restarts (issue 39 §2)
    GROUP_FAILED = "group_failed"  # a rank of a group across nodes failed here: its ranks here are stopping
    GROUP_STOPPED = "group_stopped"  # the node's ranks of a group across nodes are gone (after either)
    STOP_GROUP = "stop_group"  # the head: stop the node's ranks of a group across nodes
    START_GROUP = "start_group"  # the head: start them again (every node's are gone), the group's restart count


STOP_STACKS = "stop"  # the id of the stacks a node took before its ranks were stopped (not an answer to dump)


def message(kind: Kind, **fields: Any) -> Message:
    return {"type": kind.value, **fields}


def lines_messages(fd: int, host: str, records: Sequence[tuple[Sequence[int], bytes]]) -> Iterator[Message]:
    """A node's console write (records of a rank set and its text) as ``lines`` messages, each well inside a frame
    (``LINE_RECORDS`` records, ``LINES_TEXT`` characters); their bytes survive the trip whatever they are (see
    ``lines_of``)."""
    batch: list[list[Any]] = []
    size = 0
    for ranks, text in records:
        if batch and (len(batch) >= LINE_RECORDS or size + len(text) > LINES_TEXT):
            yield message(Kind.LINES, fd=fd, host=host, lines=batch)
            batch, size = [], 0
        batch.append([list(ranks), text.decode("utf-8", "surrogateescape")])
        size += len(text)
    if batch:
        yield message(Kind.LINES, fd=fd, host=host, lines=batch)


def lines_of(msg: Message) -> tuple[int, str, list[tuple[list[int], bytes]]]:
    """A ``lines`` message's console fd, host and records, with each text's bytes as the node read them; a field or
    record of the wrong shape or size raises ``ChannelError``."""
    problem = fields_error(msg, LINES_FIELDS)
    if problem is not None:
        raise problem
    if msg["fd"] not in (1, 2):
        raise ChannelError(f"'lines': 'fd' is {msg['fd']}, not 1 or 2")
    records: list[tuple[list[int], bytes]] = []
    for record in msg["lines"]:
        why = record_problem(record)
        if why is not None:
            raise ChannelError(f"'lines': a record: {why}")
        try:
            records.append((record[0], record[1].encode("utf-8", "surrogateescape")))
        except UnicodeEncodeError:
            raise ChannelError("'lines': a record: text that is no bytes a node read") from None
    return msg["fd"], msg["host"], records
