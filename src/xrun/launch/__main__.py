"""``python -m xrun.launch``: a process's entry, the one dispatch between the agent's two command lines. A root,
not a module of the node layer: Python runs it as ``__main__`` and nothing imports it, so it may compose what lies
above the layers (docs/architecture.md, tests/test_layers.py). ``--connect=HEAD:PORT`` first is a multi-node run's
agent (``xrun.launch.session.main``), which loads only its own path; anything else is the stand-alone agent, a
one-node job (``xrun.joined.standalone``). Either way the process ends with ``posix.leave`` (no interpreter
teardown)."""

import sys

from xrun.common.procs.posix import leave

if sys.argv[1:2] and sys.argv[1].split("=", 1)[0] == "--connect":  # as xrun.common.command renders it
    from xrun.launch.session.main import main as connect_main

    leave(connect_main(sys.argv[1:]))

from xrun.joined.standalone import main  # noqa: E402 - after the connect-mode dispatch above

leave(main())
