"""Where a node's ranks serve their collective records: one Unix socket per rank, in a directory of this node's
attempt that only the job's user may enter (0700), and what each rank's environment needs for it.

``Endpoints`` makes the directory (``close`` removes it, with the sockets and the records the ranks left in it at
their exit, ``rank<N>.last.json``; the watchdog removes it if the agent is killed); its
``rank_env`` is what a rank's environment gains: this package's ``site`` directory first on ``PYTHONPATH`` (the
rank's ``sitecustomize`` takes it off again at start-up), ``XRUN_TELEMETRY_SOCKET``, and the Flight Recorder's
bounded buffer, ``TORCH_FR_BUFFER_SIZE`` (a value the user set, under either of torch's names, is kept). Nothing
listens on TCP; what leaves the node rides the control channel.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping

from xrun.errors import IncompleteInstallError

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
SOCKET_VARIABLE = "XRUN_TELEMETRY_SOCKET"
LAST_RECORDS_SUFFIX = ".last.json"  # the rank's sitecustomize writes rank<N>.last.json at exit (the same name there)
# torch's Flight Recorder keeps the last N collectives of the process. 1,000 entries hold a hang's last
# collectives of every group and the straggler sample's 512 back; a dump of them costs the rank ~20 ms of one
# core (~19 us an entry, measured with torch 2.13) and the agent ~5 ms to read (docs/telemetry.md#cost).
BUFFER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # the name since 2.5, and the old one
DEFAULT_ENTRIES = 1000
_SUN_PATH = 107  # sockaddr_un's path, less its NUL
_LONGEST_NAME = len("rank9999999.sock")


def require_rank_site() -> None:
    """Raise ``IncompleteInstallError`` when the rank-side ``sitecustomize`` is not where ranks are told to find it:
    a rank would then run without telemetry and with a PYTHONPATH naming a missing directory, which it can tell."""
    path = os.path.join(SITE_DIR, "sitecustomize.py")
    if not os.path.isfile(path):
        raise IncompleteInstallError(path, "the ranks' collective records, and every --preload rank")


class Endpoints:
    """One attempt's socket directory on this node (``close`` removes it, and the sockets in it)."""

    def __init__(self) -> None:
        require_rank_site()
        self.directory = _socket_directory()

    def socket(self, rank: int) -> str:
        return os.path.join(self.directory, f"rank{rank}.sock")

    def last_records(self, rank: int) -> str:
        """Where rank ``rank`` leaves its records when it exits (its ``sitecustomize``'s ``leave_records``)."""
        return os.path.join(self.directory, f"rank{rank}{LAST_RECORDS_SUFFIX}")

    def rank_env(self, rank: int, env: Mapping[str, str]) -> dict[str, str]:
        """What rank ``rank``'s environment ``env`` gains (the rank's own sitecustomize gives PYTHONPATH back)."""
        path = env.get("PYTHONPATH")
        extra = {"PYTHONPATH": SITE_DIR if path is None else SITE_DIR + os.pathsep + path,
                 SOCKET_VARIABLE: self.socket(rank)}
        if not any(name in env for name in BUFFER_VARIABLES):
            extra[BUFFER_VARIABLES[0]] = str(DEFAULT_ENTRIES)
        return extra

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _socket_directory() -> str:
    """``mkdtemp`` (mode 0700, a name nobody can guess ahead) under ``$TMPDIR``, or ``/tmp`` where that path would
    make a socket's path longer than a Unix socket takes. Raises OSError when neither can be made."""
    directory = tempfile.mkdtemp(prefix="xrun-telemetry-")
    if len(directory) + 1 + _LONGEST_NAME <= _SUN_PATH:
        return directory
    os.rmdir(directory)
    return tempfile.mkdtemp(prefix="xrun-telemetry-", dir="/tmp")
