"""Who may speak on the channel: the check of the job's secret a peer offers."""

from __future__ import annotations

from typing import Any


def token_matches(expected: str, offered: Any) -> bool:
    """Constant-time comparison; anything that is not a string fails."""
    import hmac  # noqa: PLC0415 - the server's check; an agent never compares (hmac loads OpenSSL: ~2 ms)

    if not isinstance(offered, str):
        return False
    return hmac.compare_digest(expected.encode("utf-8"), offered.encode("utf-8"))
