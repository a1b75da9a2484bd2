"""Host names: what one may be, and Slurm-style host lists (``node[01-03,07]``, ``node[01-02],gpu-a[1-2]``).

A host name is RFC 1123-ish: dot-separated labels of letters, digits, ``-`` and ``_`` (63 at most each, 253 in
all), because it travels in the world info, in ``-i``/``-e`` specs and to ssh and DNS. Shared by the hostfile
parser, the allocations, pod mode's platforms, the ranks' plan and the elastic rendezvous, so it sits beside
``errors`` and belongs to neither layer.
"""

from __future__ import annotations

import ipaddress
import itertools
import re

from xrun.printable import shown

_GROUP = re.compile(r"\[([^\[\]]*)\]")
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"


class HostlistSyntaxError(ValueError):
    """A malformed host list; the message says what is wrong."""


def expand_hostlist(text: str, *, limit: int | None = None) -> list[str]:
    """Expand a comma-separated host list whose items may carry bracket ranges, in written order.

    With ``limit``, a list that would name more hosts is refused before anything is expanded (a typed
    ``node[0-99999999]`` must not take the memory of a hundred million names).
    """
    items = split_hostlist(text)
    if limit is not None:
        size = sum(pattern_size(item) for item in items)
        if size > limit:
            raise HostlistSyntaxError(f"{text!r} names {size} hosts; at most {limit} are supported")
    hosts: list[str] = []
    for item in items:
        hosts.extend(expand_host_pattern(item))
    return hosts


def pattern_size(pattern: str) -> int:
    """How many names ``expand_host_pattern(pattern)`` would give, without expanding it."""
    size = 1
    for group in _GROUP.split(pattern)[1::2]:
        if not group:
            raise HostlistSyntaxError(f"empty range '[]' in {pattern!r}")
        count = 0
        for part in group.split(","):
            low, high = _range_bounds(part.strip(), pattern)
            count += 1 if high is None else max(0, int(high) - int(low) + 1)
        size *= count
    return size


def split_hostlist(text: str) -> list[str]:
    """Split on commas that are not inside brackets: ``a[1,2],b`` -> ``['a[1,2]', 'b']``."""
    items: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistSyntaxError(f"unbalanced ']' in {text!r}")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise HostlistSyntaxError(f"unclosed '[' in {text!r}")
    items.append(current)
    if any(not item.strip() for item in items):
        raise HostlistSyntaxError(f"empty host name in {text!r}")
    return [item.strip() for item in items]


def expand_host_pattern(pattern: str) -> list[str]:
    """Expand one pattern with zero or more bracket groups (several groups combine like Slurm's)."""
    literals = _GROUP.split(pattern)
    # After split: literal, group, literal, group, ..., literal.
    fixed = literals[0::2]
    groups = literals[1::2]
    if any("[" in part or "]" in part for part in fixed):
        raise HostlistSyntaxError(f"unbalanced brackets in {pattern!r}")
    choices = [_expand_group(group, pattern) for group in groups]
    expanded = []
    for picks in itertools.product(*choices):
        name = fixed[0]
        for pick, literal in zip(picks, fixed[1:]):
            name += pick + literal
        expanded.append(name)
    return expanded


def _expand_group(group: str, pattern: str) -> list[str]:
    if not group:
        raise HostlistSyntaxError(f"empty range '[]' in {pattern!r}")
    values: list[str] = []
    for part in group.split(","):
        values.extend(_expand_range(part.strip(), pattern))
    return values


def _range_bounds(part: str, pattern: str) -> tuple[str, str | None]:
    # ASCII digits, at most 18 (int() of a 5000-digit bound raises; '٣' is a digit to \d)
    match = re.fullmatch(r"([0-9]{1,18})(?:-([0-9]{1,18}))?", part)
    if not match:
        raise HostlistSyntaxError(
            f"bad range {part!r} in {pattern!r}; expected N or N-M with digits, e.g. node[01-04,07]"
        )
    return match.group(1), match.group(2)


def _expand_range(part: str, pattern: str) -> list[str]:
    low_text, high_text = _range_bounds(part, pattern)
    if high_text is None:
        return [low_text]
    low, high = int(low_text), int(high_text)
    if high < low:
        raise HostlistSyntaxError(f"range {part!r} in {pattern!r} runs backwards")
    # Slurm keeps the zero padding of the lower bound: node[08-10] -> node08 node09 node10.
    width = len(low_text)
    return [str(n).zfill(width) for n in range(low, high + 1)]


def host_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a host of the world, or None."""
    labels = name.split(".")
    if name and len(name) <= 253 and all(re.fullmatch(_LABEL, label) for label in labels):
        return None
    return (f"{shown(name)} is not a host name (dot-separated labels of letters, digits, '-' and '_', "
            "at most 63 each and 253 in all)")


def address_problem(text: str) -> str | None:
    """Why ``text`` cannot be an address nodes connect to (a host name, an IPv4 or IPv6 address), or None."""
    try:
        ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 literal may carry a %zone
        return None
    except ValueError:
        pass
    return None if host_name_problem(text) is None else f"{shown(text)} is not a host name or IP address"
