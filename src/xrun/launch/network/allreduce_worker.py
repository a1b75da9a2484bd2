"""``python -m xrun.launch.network.allreduce_worker --rank R --spec JSON``: one rank of a pair's all-reduce.

Started by ``xrun.launch.network.allreduce_pair`` (never on the launch path: this is where torch is imported). Prints
one JSON line: ``{"ok": true, "allreduce_mbs": 812.4, "error": ""}`` (algorithm bandwidth: the tensor's bytes
over the median time of one all-reduce, after a warm-up), or ``ok`` false and a one-line error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any


def measure(rank: int, spec: dict[str, Any]) -> float:
    import torch  # only here, in the worker: nothing else of the check loads torch
    import torch.distributed as dist

    master = str(spec["master"])
    url = f"tcp://[{master}]:{spec['port']}" if ":" in master else f"tcp://{master}:{spec['port']}"
    dist.init_process_group(str(spec["backend"]), init_method=url, rank=rank, world_size=2,
                            timeout=timedelta(seconds=float(spec["timeout"])))
    try:
        device = torch.device("cuda", 0) if spec["backend"] == "nccl" else torch.device("cpu")
        tensor = torch.ones(int(spec["bytes"]) // 4, dtype=torch.float32, device=device)

        def once() -> float:
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        once()  # warm-up: connections and buffers
        times = [once() for _ in range(int(spec["iters"]))]
    finally:
        dist.destroy_process_group()
    return int(spec["bytes"]) / statistics.median(times) / 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xrun.launch.network.allreduce_worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--spec", required=True, help="the pair's rendezvous and sizes, as JSON")
    ns = parser.parse_args(argv)
    try:
        rate = measure(ns.rank, json.loads(ns.spec))
    except ImportError as err:
        print(json.dumps({"ok": False, "error": f"torch is not importable here ({sys.executable}): {err}"}))
        return 0
    except Exception as err:  # noqa: BLE001 - any failure of the group is this pair's result, as data
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(json.dumps({"ok": False, "error": f"{spec_name(ns.spec)} group failed: {first[:200]}"}))
        return 0
    print(json.dumps({"ok": True, "allreduce_mbs": rate, "error": ""}))
    return 0


def spec_name(spec: str) -> str:
    try:
        return str(json.loads(spec).get("backend", "the"))
    except (ValueError, AttributeError):
        return "the"


if __name__ == "__main__":
    sys.exit(main())
