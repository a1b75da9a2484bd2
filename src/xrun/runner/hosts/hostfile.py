"""Hostfiles: ``HOST slots=N`` per line, ``#`` comments, Slurm-style ranges; strict, line-numbered errors.

Read like every small file xrun is handed (``xrun.runner.hosts.smallfile``: regular files only, size cap); a leading
BOM is dropped; host names are checked as host names and ranges are sized before they are expanded, within
xrun's limits (``xrun.strict_numbers``: hosts per job, slots per host).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from xrun.errors import HostfileError
from xrun.hostlist import HostlistSyntaxError, expand_host_pattern, host_name_problem, pattern_size
from xrun.printable import shown
from xrun.runner.hosts.smallfile import SmallFileError, read_regular_bytes
from xrun.strict_numbers import MAX_HOSTS, MAX_RANKS, MAX_SLOTS_PER_HOST

KNOWN_KEYS = ("slots",)
# Characters that the include/exclude grammar and the world info use as separators cannot be in a host name.
_BAD_HOST_CHARS = re.compile(r"[@:,=\s]")
HOSTFILE_LIMIT = 16 << 20  # bytes: 65536 hosts of long names with comments fit many times over


@dataclass(frozen=True)
class HostEntry:
    name: str
    slots: int
    lineno: int


@dataclass(frozen=True)
class Hostfile:
    path: str
    hosts: tuple[HostEntry, ...]

    def pool(self) -> dict[str, tuple[int, ...]]:
        """Every host's slot ids (0..slots-1), in file order."""
        return {entry.name: tuple(range(entry.slots)) for entry in self.hosts}


def read_hostfile(path: str) -> Hostfile:
    """Read and parse a hostfile; any problem is a ``HostfileError`` naming the path and line."""
    try:
        data = read_regular_bytes(path, limit=HOSTFILE_LIMIT)
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:  # UTF-16 from a Windows editor, Latin-1: say where, not the codec's words
        lineno = data[: err.start].count(b"\n") + 1
        raise HostfileError(path, lineno, None, f"is not UTF-8 text (byte 0x{data[err.start]:02x}); "
                                                "save the hostfile as UTF-8") from None
    except FileNotFoundError:
        raise HostfileError(path, None, None, "no such file; pass an existing hostfile with -H/--hostfile") from None
    except IsADirectoryError:
        raise HostfileError(path, None, None, "is a directory, not a hostfile") from None
    except SmallFileError as err:
        raise HostfileError(path, None, None, err.reason) from None
    except PermissionError:
        raise HostfileError(path, None, None, "is not readable (permission denied)") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise HostfileError(path, None, None, f"cannot read: {err.__class__.__name__}: {err}") from None
    return parse_hostfile(text, path)


def parse_hostfile(text: str, path: str = "<hostfile>") -> Hostfile:
    entries: list[HostEntry] = []
    first_seen: dict[str, HostEntry] = {}  # by lower-case name: DNS names are case-insensitive, Node1 is node1
    for lineno, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        for entry in _parse_line(line, lineno, path, room=MAX_HOSTS - len(entries)):
            first = first_seen.setdefault(entry.name.lower(), entry)
            if first is not entry:
                spelled = f" as {first.name!r}" if first.name != entry.name else ""
                raise HostfileError(path, lineno, line,
                                    f"host {entry.name!r} is already listed on line {first.lineno}{spelled}")
            entries.append(entry)
    if not entries:
        raise HostfileError(path, None, None, "no hosts; add lines like 'worker-1 slots=4'")
    if sum(entry.slots for entry in entries) > MAX_RANKS:
        raise HostfileError(path, None, None, f"more than {MAX_RANKS} slots in all, the most ranks xrun accepts")
    return Hostfile(path=path, hosts=tuple(entries))


def _parse_line(line: str, lineno: int, path: str, *, room: int) -> list[HostEntry]:
    content = line.split("#", 1)[0].strip()
    if not content:
        return []
    tokens = content.split()
    pattern, options = tokens[0], tokens[1:]
    if "=" in pattern:
        raise HostfileError(path, lineno, line, "line must start with a host name, e.g. 'worker-1 slots=4'")
    slots = _parse_slots(options, line, lineno, path)
    try:
        if pattern_size(pattern) > room:  # sized before it is expanded: node[0-9999999999] must not fill memory
            raise HostfileError(path, lineno, line, f"more than {MAX_HOSTS} hosts in the file, the most xrun accepts")
        names = expand_host_pattern(pattern)
    except HostlistSyntaxError as err:
        raise HostfileError(path, lineno, line, str(err)) from None
    for name in names:
        if not name or _BAD_HOST_CHARS.search(name):
            raise HostfileError(path, lineno, line, f"bad host name {name!r}: '@', ':', ',' and '=' are not allowed")
        problem = host_name_problem(name)
        if problem:
            raise HostfileError(path, lineno, line, f"bad host name: {problem}")
    if len(set(names)) != len(names):
        raise HostfileError(path, lineno, line, "the range names the same host twice")
    return [HostEntry(name=name, slots=slots, lineno=lineno) for name in names]


def _parse_slots(options: list[str], line: str, lineno: int, path: str) -> int:
    values: dict[str, str] = {}
    for token in options:
        key, sep, value = token.partition("=")
        if not sep:
            raise HostfileError(path, lineno, line, f"unexpected {token!r}; expected key=value such as slots=4")
        if key not in KNOWN_KEYS:
            raise HostfileError(path, lineno, line, f"unknown key {key!r}; known: {', '.join(KNOWN_KEYS)}")
        if key in values:
            raise HostfileError(path, lineno, line, f"{key}= is given twice")
        values[key] = value
    if "slots" not in values:
        raise HostfileError(path, lineno, line, "missing slots=N (the number of devices on this host)")
    text = values["slots"]
    if not re.fullmatch(r"[0-9]+", text) or not text.strip("0"):
        raise HostfileError(path, lineno, line, f"slots must be a positive integer, not {shown(text)}")
    if len(text) > 9 or int(text) > MAX_SLOTS_PER_HOST:
        raise HostfileError(path, lineno, line, f"slots={shown(text)[1:-1]} is more than {MAX_SLOTS_PER_HOST}, "
                            "the most xrun accepts per host")
    return int(text)
