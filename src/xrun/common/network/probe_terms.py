"""What the head asks of a probe and the node's probes measure with (issue 24): the timeouts, the TCP probe's
duration, the all-reduce's tensor size and backend. Read by the head's requests
(``xrun.runner.network.probe_requests``) and by the node's probes (``tcp_probe``, ``allreduce_pair``), so both
ends take their defaults from one place.
"""

from __future__ import annotations

CONNECT_TIMEOUT = 3.0  # per probe connection: a firewall that drops SYNs costs this much, not TCP's minutes
SECONDS = 0.5  # throughput: send for this long (or the TCP probe's MAX_BYTES)
BYTES = 8 << 20  # 8 MiB of float32: big enough to measure bandwidth, small enough for a slow link
MIN_BYTES = 64 << 10
SECONDS_EACH = 0.2
GROUP_TIMEOUT = 30.0  # torch's import plus the rendezvous on a loaded node; a pair that cannot form by then is bad


def size_for(rate_mbs: float | None) -> int:
    """The tensor for a pair whose TCP throughput is ``rate_mbs``: ``BYTES``, less on a slow link so that one
    all-reduce takes about ``SECONDS_EACH`` there (a slow node is then named slow, not timed out as unreachable)."""
    if rate_mbs is None:
        return BYTES
    fitted = int(rate_mbs * 1e6 * SECONDS_EACH) // 4 * 4
    return max(MIN_BYTES, min(BYTES, fitted))


def backend_for(gpus_a: int, gpus_b: int) -> str:
    """nccl when both nodes of the pair have GPUs, else gloo (nccl needs a GPU on each rank)."""
    return "nccl" if gpus_a > 0 and gpus_b > 0 else "gloo"
