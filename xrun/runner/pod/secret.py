"""The shared secret of a pod-mode job: ``--token_file PATH`` or ``$XRUN_TOKEN``, or none at all.

In pod mode no head node can hand out a one-time token: the nodes must share one beforehand. Kubernetes gives
it as a Secret, mounted as a file (``--token_file``) or set as a variable (``XRUN_TOKEN``). The flag wins over
the variable. Without either the control channel is unauthenticated: nodes are then matched by the channel
key alone (run id + plan digest), which keeps two jobs apart but keeps no one out; xrun says so once.

The token is returned, never printed; ``--dry-run`` shows at most where it comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

from xrun.errors import UsageError
from xrun.runner.hosts.smallfile import SmallFileError, read_small_file

TOKEN_ENV = "XRUN_TOKEN"  # noqa: S105 - the variable's name, not a password
TOKEN_FILE_LIMIT = 64 << 10  # a Secret holds a token, not a keystore: a bigger file is the wrong file

UNAUTHENTICATED_NOTICE = (
    f"xrun: no --token_file and no {TOKEN_ENV}: the control channel is not authenticated (nodes are matched by "
    "run id and plan digest only); mount a shared Secret as --token_file to keep others out"
)


def read_token_file(path: str) -> str:
    return read_small_file(path, limit=TOKEN_FILE_LIMIT)


def load_token(
    env: Mapping[str, str], token_file: str | None, *, read: Callable[[str], str] = read_token_file
) -> str | None:
    """The shared token, or None when neither ``--token_file`` nor ``XRUN_TOKEN`` is given."""
    if token_file is not None:
        return _from_file(token_file, read)
    value = env.get(TOKEN_ENV)
    if value is None:
        return None
    if not value.strip():
        raise UsageError(TOKEN_ENV, "is set but empty; unset it or set it to the job's shared secret")
    return value


def _from_file(path: str, read: Callable[[str], str]) -> str:
    try:
        text = read(path)
    except SmallFileError as err:
        raise UsageError("--token_file", str(err)) from None
    token = text.rstrip("\r\n")  # `echo secret > file` and Secrets made from such files end with a newline
    if not token.strip():
        raise UsageError("--token_file", f"{path}: is empty; put the job's shared secret in it")
    return token


def channel_key(token: str | None, *, run_id: str, digest_sha256: str) -> str:
    """What a node must present to join: the token when there is one, else run id + plan digest."""
    return token if token is not None else f"{run_id}:{digest_sha256}"


def auth_notice(token: str | None) -> str | None:
    """The one line to print when the channel is unauthenticated; None when a token protects it."""
    return UNAUTHENTICATED_NOTICE if token is None else None
