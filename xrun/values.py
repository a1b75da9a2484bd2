"""Strict readers for the values a user types, and the limits xrun accepts: shared by both layers.

Every number, host name and displayed input of the two command lines goes through here, so that bad input
is refused where it enters, as one line (issue 12):

* numbers are ASCII digits only (``int('٣')`` is 3 and argparse's ``type=int`` takes it), finite (``float``
  reads ``inf`` and ``nan``) and bounded, with the bound stated in the error;
* host names are RFC 1123-ish: dot-separated labels of letters, digits, ``-`` and ``_`` (63 at most each,
  253 in all), because they travel in the world info, in ``-i``/``-e`` specs and to ssh and DNS;
* whatever a message quotes goes through ``shown`` (``repr``, truncated), and the entry points print through
  ``one_line``, so an error never spans two lines whatever bytes it quotes; so do the lines of the head and
  the agents (``say``, ``notice``, the reports): only the ranks' own output passes through as it is.

Every node agent imports this module on its start path, so it compiles no pattern at import (``re`` compiles
and caches each on first use) and imports ``argparse`` and ``ipaddress`` only where a function needs them.
"""

from __future__ import annotations

import math
import os
import re
import sys
from typing import Any, Callable

# Far above any real job, far below what would take minutes or gigabytes to plan (README: "Bad input").
MAX_HOSTS = 65536
MAX_SLOTS_PER_HOST = 1024
MAX_RANKS = 1 << 17  # 131072: every rank's env is planned (and shown by --dry-run) on the head node
MAX_SECONDS = 7 * 24 * 3600.0  # timeouts: a week
MAX_SHUTDOWN_TIMEOUT = 3600.0  # the grace between SIGTERM and SIGKILL
MAX_RESTARTS = 1_000_000

_SHOWN = 60  # characters of a bad value quoted in an error
_INT = r"[+-]?[0-9]{1,18}"
_DIGITS = r"[+-]?[0-9]+"
_MAX_INT = 10**18 - 1
_FLOAT = r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][+-]?[0-9]{1,3})?"
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_CONTROL = r"[\x00-\x1f\x7f-\x9f\u2028\u2029]"


def shown(value: str, *, limit: int = _SHOWN) -> str:
    """``value`` as an error quotes it: ``repr`` (one line, escapes visible), at most ``limit`` characters."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def one_line(text: str) -> str:
    """``text`` with every line break and control character escaped: the last guard of a one-line error, and
    of every line xrun prints that may quote a peer's strings (issue 22 §6: a host name, a reason, a tail or a
    stack from an agent or a pod-mode node shows ``\x1b`` as those four characters, never as a terminal
    escape)."""
    return re.sub(_CONTROL, lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def each_line(text: str) -> str:
    """``one_line`` for each line of ``text``: its line breaks kept, every other control character escaped."""
    return "\n".join(one_line(line) for line in text.split("\n"))


def parse_int(text: str) -> int | None:
    """A whole number in ASCII digits (an optional sign, at most 18 digits), or None."""
    stripped = text.strip()
    return int(stripped) if re.fullmatch(_INT, stripped) else None


def parse_seconds(text: str) -> float | None:
    """A finite decimal number (no ``inf``, ``nan``, ``1_000`` or non-ASCII digits), or None."""
    stripped = text.strip()
    if not re.fullmatch(_FLOAT, stripped):
        return None
    value = float(stripped)
    return value if math.isfinite(value) else None


def int_arg(*, high: int | None = None, what: str = "a whole number") -> Callable[[str], int]:
    """An argparse ``type``: ASCII digits, at most ``high`` (lower bounds stay with the flag's own check, and a
    flag whose range check words its own message passes no ``high``)."""

    def convert(text: str) -> int:
        import argparse  # noqa: PLC0415 - loaded already: only argparse calls a type

        if not re.fullmatch(_DIGITS, text.strip()):
            raise argparse.ArgumentTypeError(f"{shown(text)} is not {what} (ASCII digits)")
        value = parse_int(text)
        limit = _MAX_INT if high is None else high
        if value is None or value > limit:
            raise argparse.ArgumentTypeError(f"{shown(text)} is more than {limit}, the most xrun accepts")
        return value

    return convert


def seconds_arg(*, high: float = MAX_SECONDS) -> Callable[[str], float]:
    """An argparse ``type`` for a duration: finite, at most ``high`` seconds."""

    def convert(text: str) -> float:
        import argparse  # noqa: PLC0415 - loaded already: only argparse calls a type

        value = parse_seconds(text)
        if value is None:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a number of seconds")
        if value > high:
            raise argparse.ArgumentTypeError(f"{value:g} s is more than {high:g} s, the most xrun accepts")
        return value

    return convert


port_arg = int_arg(what="a TCP port")  # the range (does 0 pick a free port?) is each flag's own check


def address_problem(text: str) -> str | None:
    """Why ``text`` cannot be an address nodes connect to (a host name, an IPv4 or IPv6 address), or None."""
    import ipaddress  # noqa: PLC0415 - not on the agent's start path

    try:
        ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 literal may carry a %zone
        return None
    except ValueError:
        pass
    return None if host_name_problem(text) is None else f"{shown(text)} is not a host name or IP address"


def tolerant_streams() -> None:
    """Print any argument: a user's bytes that are not UTF-8 (``$'\\xff'``) reach Python as surrogates, which a
    strict ``PYTHONIOENCODING=utf-8`` stream refuses to write; show them escaped instead. And print whatever
    became of the streams: a closed one (``2>&-``) or a reader gone (``| head``) never ends xrun."""
    _open_closed_fds()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
        if not isinstance(stream, _ReaderMayLeave):
            setattr(sys, name, _ReaderMayLeave(stream))


def _open_closed_fds() -> None:
    """A standard stream the caller closed (``xrun train.py 2>&-``) becomes /dev/null: else every notice was an
    EBADF traceback (exit 1, the ranks' codes lost), and the first pipe or socket xrun opened took its number,
    so that the notices went into it."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)  # the lowest free number: fd
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if getattr(sys, name) is None:  # Python found it closed at start
                setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115


class _ReaderMayLeave:
    """stdout or stderr whose reader may go away (``xrun --dry-run | head``, ``xrun train.py 2>&1 | grep -m1``):
    what can no longer be written goes to /dev/null, quietly. Else the next print was a BrokenPipeError
    traceback and the job's exit code became 1, whatever the ranks did."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError, AttributeError):  # not a file (tests' StringIO): nothing to redirect
            return
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)  # what is still buffered goes nowhere at the next flush
        os.close(null)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer: the stream's own
        return getattr(self._stream, name)


def host_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a host of the world, or None."""
    labels = name.split(".")
    if name and len(name) <= 253 and all(re.fullmatch(_LABEL, label) for label in labels):
        return None
    return (f"{shown(name)} is not a host name (dot-separated labels of letters, digits, '-' and '_', "
            "at most 63 each and 253 in all)")
