"""The pod-mode part of a job request: ``--pod``, ``--platform``, ``--hosts``, ``--control_port``, ``--token_file``.

Pod mode: every node starts xrun itself (Kubernetes, PAI, Volcano, by hand) and each runs its own node's share;
``--no_ssh --node_rank K`` is its by-hand spelling, and a detected pod platform implies it. ``--hosts`` is not
pod-only: it names the hosts in host-list syntax wherever ``-H HOSTFILE`` would.

This module holds the typed request and its flags; ``xrun.runner.pod.placement.place_job`` is the planner's entry.
"""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xrun.argsplit import spellings
from xrun.errors import UsageError
from xrun.strict_numbers import port_arg

if TYPE_CHECKING:
    from xrun.runner.pod.platforms import Detection

# Flags whose parsed value always exists (a default), so that "the user typed it" must be recorded to let it
# win over a detected platform's value.
EXPLICIT_FLAGS = ("--master_port", "--run_id")

class PlatformChoice(enum.Enum):
    """``--platform``: detect from the environment, or ignore it."""

    AUTO = "auto"
    NONE = "none"


@dataclass(frozen=True)
class PodRequest:
    """What the user asked for about where the nodes come from; ``detected`` is filled by the planner."""

    pod: bool = False  # --pod
    platform: PlatformChoice = PlatformChoice.AUTO
    # --hosts PATTERN; for a batch allocation (PBS, LSF) the planner writes its hosts here, comma-separated,
    # so that the request says where the world came from.
    hosts: str | None = None
    control_port: int | None = None  # None: master port - 1 (xrun.runner.pod.placement.control_port)
    token_file: str | None = None
    explicit: frozenset[str] = frozenset()  # of EXPLICIT_FLAGS, those given on the command line
    detected: Detection | None = None
    # Filled by the planner: the platform gave a node count but no names, so the plan calls the nodes node0..N-1;
    # once a node joins it goes by the host name it reports (issue 25 §6).
    numbered: bool = False


def add_pod_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("pod mode (every node starts xrun itself: Kubernetes, PAI, Volcano, by hand)")
    add = group.add_argument
    add("--pod", action="store_true",
        help="run this node's share only; implied by --no_ssh and by a detected pod platform")
    add("--platform", default=PlatformChoice.AUTO.value, choices=[choice.value for choice in PlatformChoice],
        help="auto (default): read the node count, node rank and master from a platform's variables "
             "(Kubeflow, Volcano, PyTorchJob, Indexed Job, PBS, LSF, ...; one line on stderr says what was read); "
             "none: ignore them")
    add("--hosts", metavar="PATTERN",
        help="the hosts in host-list syntax instead of -H, e.g. 'train-[0-3].train'; each gets this node's "
             "slot count or --num_gpus")
    add(*spellings("--control_port"), type=port_arg, metavar="PORT",
        help="pod mode: node 0's control port (default: --master_port - 1; the ports above it are NVRx's)")
    add(*spellings("--token_file"), metavar="PATH",
        help="pod mode: file with the job's shared secret, e.g. a mounted Kubernetes Secret (default: $XRUN_TOKEN)")


def pod_request(ns: argparse.Namespace) -> PodRequest:
    if ns.control_port is not None and not 1 <= ns.control_port <= 65535:
        raise UsageError("--control_port", f"{ns.control_port} is not a TCP port (1..65535)")
    if ns.hosts is not None and ns.hostfile is not None:
        raise UsageError("--hosts", "cannot be combined with -H/--hostfile; name the hosts one way")
    if ns.hosts is not None and not ns.hosts.strip():
        raise UsageError("--hosts", "is empty; give a host list such as 'train-[0-3].train'")
    if ns.token_file is not None and not ns.token_file:
        raise UsageError("--token_file", "is empty; give the path of the file holding the shared secret")
    explicit = frozenset(flag for flag in EXPLICIT_FLAGS if getattr(ns, flag[2:]) is not None)
    return PodRequest(pod=ns.pod, platform=PlatformChoice(ns.platform), hosts=ns.hosts,
                      control_port=ns.control_port, token_file=ns.token_file, explicit=explicit)
