"""The one place where an argv list becomes a shell string."""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def render(argv: Iterable[str]) -> str:
    """Quote every word so that ``shlex.split(render(argv)) == list(argv)`` whatever the words contain."""
    return " ".join(shlex.quote(word) for word in argv)
