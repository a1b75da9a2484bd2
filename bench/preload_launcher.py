"""A local launcher for the preload scenario (issue 32): N ranks under xrun's own RankGroup, forked from a preload
helper (``--preload MODULES``) or started as xrun starts them today (without it), with whole-job restarts
(``--max_restarts``) that fork the next attempt from the same helper. It stands in for ``xrun --preload`` until the
agent has the flag; the ranks get what xrun's rank contract gives a local job of N ranks (rank variables, a fresh
master port per attempt, ``TORCHELASTIC_RESTART_COUNT``).

``python -m bench.preload_launcher [--preload torch] [--max_restarts N] NPROC SCRIPT [ARGS...]``; exits with the
last attempt's code.
"""

from __future__ import annotations

import argparse
import os
import sys

from xrun.launch.preload.client import PreloadHelper
from xrun.launch.ranks.processes import RankProcess
from xrun.launch.ranks.supervise import RankGroup, SuperviseOptions
from xrun.net import free_port


def ranks(n: int, script: str, args: list[str], attempt: int) -> list[RankProcess]:
    port = str(free_port("127.0.0.1"))
    argv = (sys.executable, "-u", script, *args)
    common = {"WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
              "TORCHELASTIC_RESTART_COUNT": str(attempt), "GROUP_RANK": "0"}
    return [RankProcess(rank=r, local_rank=r, argv=argv, cwd=os.getcwd(),
                        env={**os.environ, **common, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(n)]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preload_launcher")
    parser.add_argument("--preload", default="")
    parser.add_argument("--max_restarts", type=int, default=0)
    parser.add_argument("nproc", type=int)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    helper = None
    if opts.preload:
        helper = PreloadHelper.start(opts.preload.split(","), python=sys.executable, env=dict(os.environ),
                                     cwd=os.getcwd(), path0=os.path.dirname(os.path.abspath(opts.script)))
        helper.wait_ready()
    try:
        for attempt in range(opts.max_restarts + 1):
            group = RankGroup(ranks(opts.nproc, opts.script, opts.args, attempt), SuperviseOptions(host="bench"),
                              preload=helper)
            result = group.run()
            if result.exit_code == 0 or result.interrupted_by is not None:
                break
    finally:
        if helper is not None:
            helper.close()
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
