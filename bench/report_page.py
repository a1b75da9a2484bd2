"""report.html at scale (issue 40 §2): a synthetic week-long record of 1,000 nodes × 8 ranks (a restart, a spare
swap, a straggler, a sample a minute with every 8th carrying the ranks' CPU and RSS), the page written from it,
its size and the seconds to write it; with Chromium and playwright, the seconds to draw it.

    python -m bench.report_page [--nodes 1000] [--ranks 8] [--minutes 10080] [--out DIR] [--browser]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any


def synthetic_record(nodes: int, ranks: int, minutes: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """The lines of a job that fails once (rank 0), restarts, loses node 3 to a spare, and has rank 9 late."""
    rng = random.Random(seed)
    world = nodes * ranks
    hosts = [f"node{n:04d}" for n in range(nodes)]
    stride = -(-world // 1000)
    late, swapped = min(9, world - 1), min(3, nodes - 1)  # the straggler rank, the node the spare replaces
    lines: list[dict[str, Any]] = [{
        "t": 0.0, "event": "job_started", "unix_ns": 1796554073869735566, "xrun": "0.1.0", "nodes": nodes,
        "world_size": world, "hosts": [*hosts, "spare0"], "spares": 1, "max_restarts": 2, "hang_timeout": 600.0,
        "sample_every_s": 60.0, "usage_every": stride, "run_id": "xrun-synthetic",
        "command": ["python", "-u", "train.py", "--epochs", "100"], "env": {"WORLD_SIZE": str(world)},
        "local_ranks": [ranks] * nodes}]
    for n, host in enumerate(hosts):
        lines.append({"t": 1.0 + n / 1000, "event": "node_joined", "node": n, "host": host, "addr": f"10.0.{n}"})
    half = minutes * 30.0
    ends = {0: half, 1: minutes * 60.0}
    for attempt, began in ((0, 5.0), (1, half + 20.0)):
        lines.append({"t": began, "event": "attempt_started", "attempt": attempt, "nodes": nodes,
                      "master_addr": "10.0.0", "master_port": 29500})
        for n, host in enumerate(hosts):
            lines.append({"t": began + 1, "event": "node_started", "attempt": attempt, "node": n,
                          "host": "spare0" if attempt and n == swapped else host})
        lines.append({"t": began + 60, "event": "straggler_named", "attempt": attempt, "rank": late,
                      "host": hosts[late // ranks], "late_ms": 180.0})
        t = began + 60
        while t < ends[attempt] - 60:
            t += 60
            sample: dict[str, Any] = {"t": t, "event": "sample", "attempt": attempt, "collectives_scored": int(t * 10),
                                      "stragglers": [late], "late_ms": {str(late): 180.0 + rng.random() * 20}}
            if int(t / 60) % stride == 0:
                sample["cpu_pct"] = [rng.randint(90, 110) for _ in range(world)]
                sample["rss_mib"] = [rng.randint(3000, 3100) for _ in range(world)]
            lines.append(sample)
        end = ends[attempt]
        if attempt == 0:
            lines.append({"t": end, "event": "rank_exited", "attempt": 0, "node": 0, "host": hosts[0], "rank": 0,
                          "local_rank": 0, "code": 1, "signal": None, "stopped": False})
            lines.append({"t": end, "event": "failure", "attempt": 0, "reason": "rank 0 (local 0) exited with code 1",
                          "host": hosts[0], "rank": 0, "exit_code": 1})
        for rank in range(world):
            if attempt == 0 and rank == 0:
                continue
            lines.append({"t": end + 2, "event": "rank_exited", "attempt": attempt, "node": rank // ranks,
                          "host": hosts[rank // ranks], "rank": rank, "local_rank": rank % ranks,
                          "code": None if attempt == 0 else 0, "signal": "SIGTERM" if attempt == 0 else None,
                          "stopped": attempt == 0})
        lines.append({"t": end + 5, "event": "attempt_ended", "attempt": attempt, "began_at_s": began,
                      "ran_s": end - began, "ended_at_s": end + 5,
                      "root_cause": "rank 0 (local 0) exited with code 1" if attempt == 0 else None, "host": None,
                      "rank": None, "exit_code": 1 if attempt == 0 else None, "replaced": [],
                      "ending": "restart" if attempt == 0 else "final"})
        if attempt == 0:
            lines.append({"t": end + 10, "event": "node_lost", "attempt": 0, "node": swapped, "host": hosts[swapped],
                          "reason": "its agent's connection dropped"})
            lines.append({"t": end + 12, "event": "spare_swapped", "attempt": 1, "node": swapped,
                          "lost_host": hosts[swapped], "spare_host": "spare0"})
    lines.append({"t": ends[1] + 6, "event": "job_ended", "exit_code": 0, "root_cause": None, "interrupted_by": None,
                  "attempts": 2})
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--minutes", type=int, default=10080)
    parser.add_argument("--out", default=None)
    parser.add_argument("--browser", action="store_true", help="time the drawing in Chromium (playwright)")
    ns = parser.parse_args()
    from xrun.runner.report.command import report

    out = Path(ns.out or tempfile.mkdtemp(prefix="xrun-report-"))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "events.jsonl", "w") as f:
        for line in synthetic_record(ns.nodes, ns.ranks, ns.minutes):
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    began = time.monotonic()
    page = Path(report(str(out)))
    written = time.monotonic() - began
    result = {"nodes": ns.nodes, "ranks": ns.nodes * ns.ranks, "minutes": ns.minutes,
              "record_mb": round(os.path.getsize(out / "events.jsonl") / 1e6, 1),
              "page_mb": round(page.stat().st_size / 1e6, 2), "write_s": round(written, 2)}
    if ns.browser:
        from tests.report_browser import open_report

        drawn = open_report(page, out, "report-scale")
        result["draw_s"], result["busy_s"] = round(drawn.seconds, 2), round(drawn.busy_s, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
