"""What xrun prints of text it did not write: quoted, on one line, escapes visible.

Whatever a message quotes goes through ``shown`` (``repr``, truncated), and the entry points print through
``one_line``, so an error never spans two lines whatever bytes it quotes; so do the lines of the head and the
agents (``say``, ``notice``, the reports): only the ranks' own output passes through as it is (issue 12, issue 22
§6). ``columns`` lays out every table xrun prints (``xrun check``'s hosts, ``--network``'s nodes, the ranks'
figures). Shared by both layers and the channel.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SHOWN = 60  # characters of a bad value quoted in an error
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


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` (a header first) as lines: every column but the last padded to its widest cell, two spaces
    apart; the last one as it is, so a long note neither widens the table nor ends in spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] for row in rows]
