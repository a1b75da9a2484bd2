"""A node's one-time key, announced on its agent's own output stream (``--token=announce``: pdsh).

pdsh gives a remote command no stdin, and its command line is every local user's to read in ``ps``; but each
agent's stderr reaches the head over the engine's own encrypted ssh session, and no other user can write into
it. So such an agent makes a fresh key, writes one line ``xrun-key NODE HEX`` to its stderr before it
connects, and proves that key on the channel; the head takes the first announcement for each node
(``xrun.runner.job.keys``) and keeps the line off the console (``AnnouncementFilter``).
"""

from __future__ import annotations

import re

from xrun.linesieve import LineSieve

PREFIX = b"xrun-key "
_LINE = re.compile(rb"xrun-key (\d{1,7}) ([0-9a-f]{64})")
MAX_LINE = len(PREFIX) + 8 + 64  # a longer line at a line start is not an announcement: written through


def announce_line(node_rank: int, key_hex: str) -> bytes:
    return PREFIX + f"{node_rank} {key_hex}\n".encode("ascii")


def parse_announcement(line: bytes) -> tuple[int, str] | None:
    """``(node, key_hex)`` for an announcement line (without its newline), else None."""
    match = _LINE.fullmatch(line.rstrip(b"\r"))
    return (int(match.group(1)), match.group(2).decode("ascii")) if match else None


class AnnouncementFilter:
    """A launcher's stderr as it comes: announcements taken out, everything else passed on at once
    (``xrun.linesieve``: only what may still become an announcement is held back)."""

    def __init__(self) -> None:
        self._sieve = LineSieve(PREFIX, MAX_LINE)

    def feed(self, chunk: bytes) -> tuple[bytes, list[tuple[int, str]]]:
        """(the bytes to write now, the announcements completed by ``chunk``)."""
        found: list[tuple[int, str]] = []

        def take(line: bytes) -> bool:
            parsed = parse_announcement(line)
            if parsed is not None:
                found.append(parsed)
            return parsed is not None

        return self._sieve.feed(chunk, take), found

    def flush(self) -> bytes:
        """What is held at the end of the stream: it never became an announcement."""
        return self._sieve.flush()
