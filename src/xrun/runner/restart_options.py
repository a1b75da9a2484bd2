"""The restart part of a job request (issue 23): ``--max_restarts`` for static jobs and ``--min_attempt_s``.

``--max_restarts N`` is shared with ``--elastic`` (there torch's agent restarts each node's worker group); on a
static job xrun itself stops every rank on every node after a failure and starts the whole job again, up to N
times, over the same agents and channel. ``--min_attempt_s`` is the no-progress rule's bound: two attempts in a
row that fail the same way (same rank, same exit code), each sooner than that after its ranks started, stop the
restarts (``xrun.runner.job.attempts``). ``--spares N``: the last N selected hosts stand by outside the world
as hot spares (``xrun.runner.job.spares``), each ready to take the place of a node ``--precheck`` finds bad before
the ranks start (no restart: issue 33) or of a lost node at a restart (``--max_restarts``); without either flag a
spare could never be used, so ``--spares`` needs one of them. The pure rules live there; this module holds the
typed request.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from xrun.argsplit import spellings
from xrun.errors import UsageError
from xrun.strict_numbers import MAX_HOSTS, int_arg, seconds_arg

DEFAULT_MIN_ATTEMPT_S = 60.0


@dataclass(frozen=True)
class RestartPolicy:
    """How a static job keeps going after a failure; ``max_restarts`` 0: it does not."""

    max_restarts: int = 0
    min_attempt_s: float = DEFAULT_MIN_ATTEMPT_S  # 0: no no-progress stop, only the count
    spares: int = 0  # --spares: the last N selected hosts are hot spares, outside the world

    @property
    def restarts(self) -> bool:
        return self.max_restarts > 0


def add_restart_flags(parser: argparse.ArgumentParser) -> None:
    """``--min_attempt_s`` and ``--spares`` (``--max_restarts`` is defined with the elastic flags, which share it)."""
    parser.add_argument(
        *spellings("--min_attempt_s"), type=seconds_arg(), metavar="SECONDS",
        help=f"with --max_restarts: stop restarting when two attempts in a row fail the same way (same rank, same "
        f"exit code), each within this many seconds of its start (default {DEFAULT_MIN_ATTEMPT_S:g}; 0: never)")
    parser.add_argument(
        *spellings("--spares"), type=int_arg(high=MAX_HOSTS), metavar="N",
        help="with --precheck or --max_restarts: the last N selected hosts stand by as hot spares outside the "
        "world; one takes the place of a node --precheck finds bad before any rank starts, or of a lost node at "
        "the next attempt (same node rank, same slots; under --replica_groups only the lost node's groups start "
        "again there); ssh and pdsh (default 0)")


def restart_policy(ns: argparse.Namespace) -> RestartPolicy:
    """The static job's restart policy (with --elastic, --max_restarts is torch's: the policy stays empty)."""
    if ns.spares is not None and ns.spares < 0:
        raise UsageError("--spares", f"must be >= 0, not {ns.spares}")
    if ns.spares and ns.elastic:
        raise UsageError("--spares", "does not apply with --elastic (torch's rendezvous decides which nodes take part)")
    if ns.spares and not ns.max_restarts and not ns.precheck:
        raise UsageError("--spares", "a spare takes the place of a node --precheck finds bad before the start, or of "
                         "a lost node at a restart: give --precheck, --max_restarts N, or both")
    if ns.elastic:
        if ns.min_attempt_s is not None:
            raise UsageError("--min_attempt_s", "does not apply with --elastic (torch's agent restarts the workers)")
        return RestartPolicy()
    if ns.max_restarts is not None and ns.max_restarts < 0:
        raise UsageError("--max_restarts", f"must be >= 0, not {ns.max_restarts}")
    if ns.min_attempt_s is not None and ns.min_attempt_s < 0:
        raise UsageError("--min_attempt_s", f"must be >= 0 seconds, not {ns.min_attempt_s:g}")
    min_attempt = DEFAULT_MIN_ATTEMPT_S if ns.min_attempt_s is None else ns.min_attempt_s
    return RestartPolicy(max_restarts=ns.max_restarts or 0, min_attempt_s=min_attempt, spares=ns.spares or 0)
