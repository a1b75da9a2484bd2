"""Reading the values a platform or batch system puts in a node's environment: strict, bounded, one line each.

Shared by ``xrun.runner.pod.platforms`` (pod platforms) and ``xrun.runner.hosts.batch_alloc`` (PBS, LSF). Numbers are
ASCII digits only (``str.isdigit`` also accepts ``'٣'`` and ``'²'``, which ``int`` then reads or rejects
inconsistently) and bounded, so that a wrong variable cannot make xrun build a world of 10**12 ranks.
"""

from __future__ import annotations

import re

from xrun.errors import XrunError
from xrun.hostlist import host_name_problem
from xrun.strict_numbers import MAX_HOSTS as MAX_NODES
from xrun.strict_numbers import MAX_SLOTS_PER_HOST as MAX_SLOTS_PER_NODE

# Bounds on what a platform may describe are xrun's own limits (xrun.strict_numbers), under the platform's names.
__all__ = ["MAX_NODES", "MAX_SLOTS_PER_NODE", "PlatformError", "host_name_problem", "parse_address", "parse_count",
           "parse_host_list", "parse_port"]

_DIGITS = re.compile(r"[0-9]{1,18}")
# A rendezvous address may also be an IPv6 literal (with a %zone); it must not look like an option.
_ADDRESS = re.compile(r"[A-Za-z0-9:][A-Za-z0-9._:%-]{0,252}")
_SHOWN = 60  # characters of a bad value quoted in an error


class PlatformError(XrunError):
    """A platform variable (or a file it names) that cannot be read as documented."""

    def __init__(self, variable: str, value: str, reason: str) -> None:
        self.variable = variable
        self.value = value
        self.reason = reason
        shown = value if len(value) <= _SHOWN else value[:_SHOWN] + "..."
        super().__init__(f"{variable}={shown!r}: {reason}")


def parse_count(variable: str, text: str, *, low: int, high: int, what: str) -> int:
    """A whole number in ``low..high`` (ASCII digits, surrounding whitespace allowed)."""
    stripped = text.strip()
    if not _DIGITS.fullmatch(stripped):
        raise PlatformError(variable, text, f"{what} must be a whole number (ASCII digits)")
    value = int(stripped)
    if not low <= value <= high:
        raise PlatformError(variable, text, f"{what} must be in {low}..{high}")
    return value


def parse_port(variable: str, text: str) -> int:
    return parse_count(variable, text, low=1, high=65535, what="a TCP port")


def parse_address(variable: str, text: str) -> str:
    """A host name, IPv4 or IPv6 address (the rendezvous address every node connects to)."""
    stripped = text.strip()
    if not _ADDRESS.fullmatch(stripped):
        raise PlatformError(variable, text, "not a host name or IP address")
    return stripped


def parse_host_list(variable: str, text: str, separators: str) -> tuple[str, ...]:
    """Distinct host names separated by any of ``separators`` (e.g. SkyPilot's one IP per line)."""
    names = [name for name in re.split(f"[{re.escape(separators)}]", text.strip()) if name.strip()]
    if not names:
        raise PlatformError(variable, text, "lists no hosts")
    if len(names) > MAX_NODES:
        raise PlatformError(variable, text, f"lists more than {MAX_NODES} hosts")
    for name in names:
        problem = host_name_problem(name.strip())
        if problem:
            raise PlatformError(variable, text, problem)
    hosts = tuple(name.strip() for name in names)
    if len(set(hosts)) != len(hosts):
        raise PlatformError(variable, text, "names a host twice")
    return hosts
