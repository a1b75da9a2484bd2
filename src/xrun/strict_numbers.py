"""Strict readers for the numbers a user types, and the limits xrun accepts: shared by both layers.

Every number of the two command lines goes through here, so that bad input is refused where it enters, as one
line (issue 12): ASCII digits only (``int('٣')`` is 3 and argparse's ``type=int`` takes it), finite (``float``
reads ``inf`` and ``nan``) and bounded, with the bound stated in the error. Patterns are compiled on first use
(``re`` caches them), not at import: every node agent imports this module on its start path.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable

from xrun.printable import shown

# Far above any real job, far below what would take minutes or gigabytes to plan (README: "Bad input").
MAX_HOSTS = 65536
MAX_SLOTS_PER_HOST = 1024
MAX_RANKS = 1 << 17  # 131072: every rank's env is planned (and shown by --dry-run) on the head node
MAX_SECONDS = 7 * 24 * 3600.0  # timeouts: a week
MAX_SHUTDOWN_TIMEOUT = 3600.0  # the grace between SIGTERM and SIGKILL
MAX_RESTARTS = 1_000_000

_INT = r"[+-]?[0-9]{1,18}"
_DIGITS = r"[+-]?[0-9]+"
_MAX_INT = 10**18 - 1
_FLOAT = r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][+-]?[0-9]{1,3})?"


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
        value = parse_seconds(text)
        if value is None:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a number of seconds")
        if value > high:
            raise argparse.ArgumentTypeError(f"{value:g} s is more than {high:g} s, the most xrun accepts")
        return value

    return convert


port_arg = int_arg(what="a TCP port")  # the range (does 0 pick a free port?) is each flag's own check
