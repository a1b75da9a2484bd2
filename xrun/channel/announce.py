"""A node's one-time key, announced on its agent's own output stream (``--token=announce``: pdsh).

pdsh gives a remote command no stdin, and its command line is every local user's to read in ``ps``; but each
agent's stderr reaches the head over the engine's own encrypted ssh session, and no other user can write into
it. So such an agent makes a fresh key, writes one line ``xrun-key NODE HEX`` to its stderr before it
connects, and proves that key on the channel; the head takes the first announcement for each node
(``xrun.runner.job.keys``) and keeps the line off the console (``AnnouncementFilter``).
"""

from __future__ import annotations

import re

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
    """A launcher's stderr as it comes: announcements taken out, everything else passed on at once.

    Only what may still become an announcement (a line start that matches the prefix so far) is held back, so
    a rank's progress line or a partial line is never delayed.
    """

    def __init__(self) -> None:
        self._held = b""
        self._mid_line = False

    def feed(self, chunk: bytes) -> tuple[bytes, list[tuple[int, str]]]:
        """(the bytes to write now, the announcements completed by ``chunk``)."""
        data, self._held = self._held + chunk, b""
        out = bytearray()
        found: list[tuple[int, str]] = []
        i = 0
        while i < len(data):
            newline = data.find(b"\n", i)
            if not self._mid_line:
                line = data[i:] if newline < 0 else data[i:newline]
                if line[: len(PREFIX)] == PREFIX[: len(line)] and len(line) <= MAX_LINE:
                    if newline < 0:
                        self._held = bytes(line)  # may still become an announcement
                        break
                    parsed = parse_announcement(line)
                    if parsed is not None:
                        found.append(parsed)
                        i = newline + 1
                        continue
            end = len(data) if newline < 0 else newline + 1
            out += data[i:end]
            self._mid_line = newline < 0
            i = end
        return bytes(out), found

    def flush(self) -> bytes:
        """What is held at the end of the stream: it never became an announcement."""
        held, self._held = self._held, b""
        return held
