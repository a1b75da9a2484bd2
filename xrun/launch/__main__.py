"""``python -m xrun.launch``: a connect-mode agent (every node of a multi-node run) goes straight to
``xrun.launch.connect``, which imports only its start path; the stand-alone form parses with ``xrun.launch.cli``.
Either way the process ends with ``posix.leave`` (no interpreter teardown)."""

import sys

from xrun.launch.procs.posix import leave

if sys.argv[1:2] and sys.argv[1].split("=", 1)[0] == "--connect":  # xrun.launch.cli.is_connect_mode, unimported
    from xrun.launch.connect import main as connect_main

    leave(connect_main(sys.argv[1:]))

from xrun.launch.cli import main  # noqa: E402 - after the connect-mode dispatch above

leave(main())
