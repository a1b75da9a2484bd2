"""The stand-alone agent (``python -m xrun.launch --world_info=B64 --node_rank=K --master_addr=A --master_port=P
SCRIPT ARGS``, DeepSpeed's per-node form: each node's launcher runs alone, no head) as a one-node job (issue 38 §1):

    the command line parsed (xrun.common.agent_cli, the flags the head renders in xrun.common.command) and this
    node's spec checked here, each a one-line error with exit code 2
    -> ``standalone_plan`` (xrun.runner.plan): a plan with this node alone, its ranks numbered in the whole world
       and told its WORLD_SIZE, MASTER_ADDR/PORT as given (no port is picked: every node was told the same)
    -> ``run_one_node_job`` (xrun.joined.one_node): the head's control server and the node's driver in this
       process over a socketpair, as the local run: the hang doctor, --log_dir's summary.json and failure.json,
       preload and the failure report are the head's and the driver's

``python -m xrun.launch`` reaches this module from the process's entry (xrun.launch.__main__, a root: see
docs/architecture.md); ``--connect``, a multi-node run's agent, never loads it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from xrun.common.agent_cli import parse_agent_argv
from xrun.common.preflight import check_spec
from xrun.errors import XrunError
from xrun.fdlimit import raise_open_files_limit
from xrun.joined.one_node import run_one_node_job
from xrun.printable import one_line
from xrun.runner.plan import standalone_plan
from xrun.std_streams import tolerant_streams


def main(argv: Sequence[str] | None = None) -> int:
    """The stand-alone agent's exit code for ``argv`` (``sys.argv[1:]`` when None)."""
    tolerant_streams()
    raise_open_files_limit()  # before any pipe or socket: the node's ranks must not die of the login's 1,024
    try:
        plan = standalone_plan(parse_agent_argv(sys.argv[1:] if argv is None else argv))
        check_spec(plan.nodes[0])  # a usage error in the agent's own words, before the job starts
    except XrunError as err:
        print(f"xrun.launch: {one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    return run_one_node_job(plan)
