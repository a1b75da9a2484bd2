"""Test driver: run one RankGroup as a real agent process would, ``run_group.py SPEC.json``.

SPEC: {"options": {SuperviseOptions fields}, "procs": [{RankProcess fields}], "result": PATH,
       "preload": {"modules": [...], "path0": DIR} (optional: the ranks, python without options, are forked from a
       preload helper)}
Writes failure_json(result) plus the agent's peak RSS ("max_rss_kib") to PATH, prints the failure report to
stderr when something failed, and exits with the node's exit code.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from xrun.common.result.failure_report import failure_json, format_failure_report  # noqa: E402
from xrun.launch.preload.client import PreloadHelper  # noqa: E402
from xrun.launch.ranks.processes import RankProcess  # noqa: E402
from xrun.launch.ranks.supervise import RankGroup, SuperviseOptions  # noqa: E402


def peak_rss_kib() -> int:
    """VmHWM of this process image (ru_maxrss would include the parent's peak from before exec)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    procs = [
        RankProcess(
            rank=p["rank"],
            local_rank=p.get("local_rank", p["rank"]),
            argv=tuple(p["argv"]),
            env=p["env"],
            cpus=frozenset(p["cpus"]) if p.get("cpus") is not None else None,
            cwd=p.get("cwd"),
        )
        for p in spec["procs"]
    ]
    helper = None
    if spec.get("preload"):
        helper = PreloadHelper.start(spec["preload"]["modules"], python=sys.executable, options=(),
                                     env=dict(os.environ), cwd=os.getcwd(), path0=spec["preload"]["path0"])
        helper.wait_ready()
        print(f"helper {helper.pid}", file=sys.stderr, flush=True)
    try:
        result = RankGroup(procs, SuperviseOptions(**spec["options"]), preload=helper).run()
    finally:
        if helper is not None:
            helper.close()
    data = failure_json(result)
    data["max_rss_kib"] = peak_rss_kib()
    tmp = spec["result"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, spec["result"])
    if result.exit_code:
        sys.stderr.write(format_failure_report(result) + "\n")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
