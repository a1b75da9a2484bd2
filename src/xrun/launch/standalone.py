"""The stand-alone agent (``python -m xrun.launch --world_info=...``, DeepSpeed's form): its command line parsed
(``xrun.common.agent_cli``, shared with the head), the node's preflight, then the node's ranks run here."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from xrun.common.agent_cli import parse_agent_argv
from xrun.common.preflight import check_spec
from xrun.errors import XrunError
from xrun.fdlimit import raise_open_files_limit
from xrun.launch.agent import preloaded, run_node
from xrun.printable import one_line
from xrun.std_streams import tolerant_streams


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    tolerant_streams()
    raise_open_files_limit()  # before any pipe or socket: the node's ranks must not die of the login's 1,024
    try:
        command = parse_agent_argv(args)
        spec = command.node_spec()
        check_spec(spec)
        with preloaded(spec) as helper:
            return run_node(spec, preload=helper)
    except XrunError as err:
        print(f"xrun.launch: {one_line(str(err))}", file=sys.stderr)
        return err.exit_code
