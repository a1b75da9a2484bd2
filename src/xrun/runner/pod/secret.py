"""The shared secret of a pod-mode job: ``--token_file PATH`` or ``$XRUN_TOKEN``, or none at all.

In pod mode no head node can hand out a one-time token: the nodes must share one beforehand. Kubernetes gives
it as a Secret, mounted as a file (``--token_file``) or set as a variable (``XRUN_TOKEN``). The flag wins over
the variable. Without either the control channel is unauthenticated: nodes are then matched by the channel
key alone (run id + plan digest), which keeps two jobs apart but keeps no one out; every node says so at start,
in one line with the fix (issue 22 §5). A secret shorter than ``MIN_TOKEN_CHARS`` is refused before anything
starts: a few characters are guessed in seconds.

The token is returned, never printed (nor its length's worth of it); ``--dry-run`` shows at most where it comes
from. What a rank can read of it: with ``XRUN_TOKEN`` the variable is removed from xrun's environment before any
rank starts, but Linux keeps a process's initial environment readable in ``/proc/PID/environ`` for its own user,
so a rank (same user) can read it from its ancestor xrun's; ``--token_file`` keeps the secret out of every
process's environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

from xrun.channel.proof import POD_PURPOSE, derive_key, stretch, token_key
from xrun.errors import UsageError
from xrun.runner.hosts.smallfile import SmallFileError, read_small_file

TOKEN_ENV = "XRUN_TOKEN"  # noqa: S105 - the variable's name, not a password
TOKEN_FILE_LIMIT = 64 << 10  # a Secret holds a token, not a keystore: a bigger file is the wrong file
MIN_TOKEN_CHARS = 16  # a 4-digit secret was guessed in 1.2 s (issue 22); `openssl rand -hex 32` gives 64
MAKE_ONE = "openssl rand -hex 32"

UNAUTHENTICATED_NOTICE = (
    f"xrun: WARNING: no --token_file and no {TOKEN_ENV}: the control channel is not authenticated: anyone who can "
    "reach node 0's control port can join this job or end it; fix: kubectl create secret generic xrun-token "
    f"--from-literal=token=$({MAKE_ONE}), mount it on every node and add --token_file /etc/xrun/token "
    "(docs/platforms.md)"
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
    return _long_enough(value, TOKEN_ENV)


def _long_enough(token: str, source: str, where: str = "") -> str:
    """``token``, unless it is short enough to guess: then a one-line usage error (exit 2) naming its length."""
    if len(token) < MIN_TOKEN_CHARS:
        raise UsageError(source, f"{where}the shared secret is {len(token)} character(s) long, at least "
                                 f"{MIN_TOKEN_CHARS} are needed (a short one is guessed in seconds); make one with "
                                 f"`{MAKE_ONE}`")
    return token


def _from_file(path: str, read: Callable[[str], str]) -> str:
    try:
        text = read(path)
    except SmallFileError as err:
        raise UsageError("--token_file", str(err)) from None
    token = text.rstrip("\r\n")  # `echo secret > file` and Secrets made from such files end with a newline
    if not token.strip():
        raise UsageError("--token_file", f"{path}: is empty; put the job's shared secret in it")
    return _long_enough(token, "--token_file", f"{path}: ")


def pod_key(token: str | None, *, run_id: str) -> bytes:
    """The key every node of a pod-mode job proves (and node 0 first, xrun.channel.handshake): the shared secret,
    stretched (PBKDF2, once per process) so that a proof seen on the wire cannot be turned into guesses cheaply;
    without a secret, the run id, which anyone who knows the job's command line knows too (hence the notice)."""
    if token is None:
        return token_key(run_id, POD_PURPOSE)
    return derive_key(stretch(token.encode("utf-8", "surrogateescape"), run_id.encode("utf-8")), POD_PURPOSE)


def auth_notice(token: str | None) -> str | None:
    """The one line to print when the channel is unauthenticated; None when a token protects it."""
    return UNAUTHENTICATED_NOTICE if token is None else None
