"""Pod mode's entry for the planner: ``place_job`` turns the request into planner terms and a host pool.

It imports ``xrun.runner.pod.placement`` (which turns request + detection into the world; ``xrun.runner.pod.platforms``
detects) only when a pod flag is given or a platform's marker variable is set, so that a plain run pays nothing
for platform detection; otherwise the answer is None and the planner (``xrun.runner.planner``) looks the pool up
itself. The request's pod part and its flags live in ``xrun.runner.pod.options``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from xrun.runner.pod.options import PlatformChoice

if TYPE_CHECKING:
    from xrun.runner.hosts.nodeio import NodeIO
    from xrun.runner.plan import JobRequest
    from xrun.runner.pod.placement import Placement

# Without one of these (or a VC_<TASK>_HOSTS) no platform is detected (tests/test_platforms.py checks it).
PLATFORM_MARKERS = ("PET_NNODES", "WORLD_SIZE", "VC_TASK_INDEX", "LWS_GROUP_SIZE", "SKYPILOT_NODE_IPS",
                    "JOB_COMPLETION_INDEX", "PBS_JOBID", "LSB_JOBID")


def platform_markers_present(env: Mapping[str, str]) -> bool:
    """Could ``xrun.runner.pod.platforms.detect`` find anything in ``env``? (cheap: names only)"""
    return any(name in env for name in PLATFORM_MARKERS) or any(
        name.startswith("VC_") and name.endswith("_HOSTS") for name in env
    )


def place_job(request: JobRequest, environ: Mapping[str, str], io: NodeIO) -> Placement | None:
    """``xrun.runner.pod.placement.place``'s answer, or None when no pod flag is given and no platform can be
    detected."""
    pod = request.pod
    asked = pod.pod or pod.hosts is not None or pod.control_port is not None or pod.token_file is not None
    asked = asked or request.remote.no_ssh or request.remote.node_rank is not None
    if not asked and (pod.platform is PlatformChoice.NONE or not platform_markers_present(environ)):
        return None
    from xrun.runner.pod.placement import place  # detection and its files: only when they can matter

    return place(request, environ, io)
