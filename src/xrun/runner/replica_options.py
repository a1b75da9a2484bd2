"""The replica-groups part of a job request (issue 39 §2): ``--replica_groups G`` for torchft.

torchft's README runs one torchrun per replica group beside a Lighthouse the user starts; with ``--replica_groups
G`` one xrun does both: the world's ranks fall into G groups of equal size (in rank order), each rank gets its
group's contract (``xrun.common.rankplan.group_env``) and each group its own ``MASTER_PORT`` and store, and node 0
runs torchft's Lighthouse. The ports: with ``--master_port P`` group g's is ``P + g`` and the Lighthouse's
``P + G``; without it a local run draws a free port for each (the planner, ``with_replica_ports``) and a run on
several nodes counts them up from the default master port. On several nodes a group may lie within one node (its
node's agent supervises it alone) or span nodes (the head relays its stop and start, xrun.runner.replicas.spans);
each group's port must be known up front there (``check_ports_known``).
This module holds the typed request and the pure steps from it to the node spec's ``ReplicaGroups``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from xrun.argsplit import spellings
from xrun.common.spec import ReplicaGroups
from xrun.errors import UsageError
from xrun.strict_numbers import MAX_RANKS, int_arg

FLAG = "--replica_groups"


@dataclass(frozen=True)
class ReplicaRequest:
    """``--replica_groups G``; ``ports``: a local run's free ports (each group's, then the Lighthouse's) where no
    ``--master_port`` was given, drawn by the planner (empty: counted up from the master port)."""

    groups: int
    ports: tuple[int, ...] = ()


def add_replica_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        *spellings(FLAG), type=int_arg(high=MAX_RANKS), metavar="G",
        help="torchft: split the ranks into G replica groups of equal size, each with its own RANK, WORLD_SIZE, "
        "MASTER_PORT and store, and run torchft_lighthouse on node 0 (REPLICA_GROUP_ID, NUM_REPLICA_GROUPS, "
        "TORCHFT_LIGHTHOUSE; docs/replica-groups.md)")


def replica_request(ns: argparse.Namespace) -> ReplicaRequest | None:
    """The request's replica groups (None without the flag); what cannot work with them is refused here."""
    if ns.replica_groups is None:
        return None
    if ns.replica_groups < 1:
        raise UsageError(FLAG, f"must be at least 1, not {ns.replica_groups}")
    if ns.elastic:
        raise UsageError(FLAG, "does not apply with --elastic yet (torch's rendezvous numbers the ranks of one world)")
    return ReplicaRequest(groups=ns.replica_groups)


def counted_ports(groups: int, master_port: int) -> tuple[int, ...]:
    """The ports of a run on several nodes (every node counts them alike): group g's store at ``master_port + g``,
    the Lighthouse's after them at ``master_port + groups``. Pod mode's control port stays below them
    (``xrun.runner.pod.placement.control_port``)."""
    return tuple(range(master_port, master_port + groups + 1))


def replica_groups(request: ReplicaRequest, *, world_size: int, master_port: int) -> ReplicaGroups:
    """Pure: the groups of a world of ``world_size`` ranks, their ports and the Lighthouse's."""
    groups = request.groups
    if world_size % groups:
        raise UsageError(FLAG, f"{groups} groups cannot split {world_size} ranks evenly; give a divisor of "
                         f"{world_size}")
    ports = request.ports or counted_ports(groups, master_port)
    if ports[-1] > 65535:
        raise UsageError(FLAG, f"{groups} groups need ports {master_port}-{ports[-1]} (one per group and the "
                         "Lighthouse's after them); give a lower --master_port")
    return ReplicaGroups(count=groups, master_ports=ports[:groups], lighthouse_port=ports[groups])


def check_ports_known(master_port: int) -> None:
    """Pure: on several nodes each group's port must be known before the start (every node counts it up from the
    master port). A group may span nodes (its stop and start are the head's, xrun.runner.replicas.spans)."""
    if master_port == 0:
        raise UsageError(FLAG, "needs a master port on several nodes (each group's is counted up from it): leave "
                         "--master_port out, or give one other than 0")
