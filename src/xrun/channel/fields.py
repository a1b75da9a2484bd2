"""The shapes of the messages a peer sends before it has proven itself (auth, challenge, hello), and of those an
admitted node sends in bulk: its console's line records (``lines``) and the outer shapes of its larger reports
(collectives, entry times, usage), whose items their own readers check.

A stranger's message is checked field by field (type, length, range) before any of its values is used, so
the checks that follow (a proof comparison, a node-rank lookup, a line on the console) see only sane values:
``fields_error(msg, AUTH_FIELDS)`` returns a ``ChannelError`` naming the first odd field, or None. Fields not
listed are ignored (a newer peer may add some); a listed field that is required must be there.

Pure and cheap: no import beyond the standard library's ``enum`` and ``typing``. ``Field`` is a ``NamedTuple``
(typed, immutable) rather than a frozen dataclass: making a frozen dataclass's class costs ~0.4-1.2 ms, on every
connecting agent's start path, where issue 22 §7 allows the channel's security 10 ms in all.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, NamedTuple

from xrun.channel.framing import ChannelError, Message

HEX_DIGITS = frozenset("0123456789abcdef")
NONCE_HEX = 64  # 32 random bytes, lowercase hex
PROOF_HEX = 64  # an HMAC-SHA256, lowercase hex
MAX_NODE_RANK = 1 << 20  # far beyond any job; keeps a stranger's number small


class FieldKind(enum.Enum):
    HEX = "lowercase hex of exactly `limit` characters"
    TEXT = "printable text of at most `limit` characters"
    INT = "an integer from 0 to `limit`"
    OBJECT = "a JSON object of at most `limit` entries"
    LIST = "a JSON list of at most `limit` entries"


class Field(NamedTuple):
    kind: FieldKind
    limit: int
    required: bool = True

    def problem(self, value: Any) -> str | None:
        """Why ``value`` does not fit, or None."""
        if self.kind is FieldKind.HEX:
            ok = isinstance(value, str) and len(value) == self.limit and HEX_DIGITS.issuperset(value)
            return None if ok else f"expected {self.limit} lowercase hex digits"
        if self.kind is FieldKind.INT:
            # bool is an int in Python, not in the protocol
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= self.limit
            return None if ok else f"expected an integer from 0 to {self.limit}"
        if self.kind is FieldKind.OBJECT:
            ok = isinstance(value, dict) and len(value) <= self.limit
            return None if ok else f"expected an object of at most {self.limit} entries"
        if self.kind is FieldKind.LIST:
            ok = isinstance(value, list) and len(value) <= self.limit
            return None if ok else f"expected a list of at most {self.limit} entries"
        ok = isinstance(value, str) and len(value) <= self.limit and _printable(value)
        return None if ok else f"expected printable text of at most {self.limit} characters"


def _printable(text: str) -> bool:
    """No control character (a host name reaches the console) and no lone surrogate (it reaches an encoder)."""
    if text.isascii():
        return text.isprintable()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return text.isprintable()


def fields_error(msg: Message, fields: Mapping[str, Field]) -> ChannelError | None:
    """The first field of ``msg`` that is missing or misshapen, as a ChannelError; None when all fit."""
    kind = repr(str(msg.get("type"))[:16])  # a stranger's string: short, and escaped before any console sees it
    for name, field in fields.items():
        if name not in msg:
            if field.required:
                return ChannelError(f"{kind}: no {name!r}")
            continue
        problem = field.problem(msg[name])
        if problem:
            return ChannelError(f"{kind}: {name!r}: {problem}")
    return None


NONCE = Field(FieldKind.HEX, NONCE_HEX)
NODE_RANK = Field(FieldKind.INT, MAX_NODE_RANK)

AUTH_FIELDS: Mapping[str, Field] = {"client_nonce": NONCE, "node_rank": NODE_RANK}
CHALLENGE_FIELDS: Mapping[str, Field] = {
    "server_nonce": NONCE,
    "server_proof": Field(FieldKind.HEX, PROOF_HEX, required=False),  # pod mode only
}
HELLO_FIELDS: Mapping[str, Field] = {
    "proof": Field(FieldKind.HEX, PROOF_HEX),
    "node_rank": NODE_RANK,
    "host": Field(FieldKind.TEXT, 255),  # HOST_NAME_MAX is 64; an FQDN may reach 255
    "pid": Field(FieldKind.INT, (1 << 31) - 1),
    "addr": Field(FieldKind.TEXT, 128),  # an IPv6 address with a zone id
    "versions": Field(FieldKind.OBJECT, 16),
    "digest": Field(FieldKind.OBJECT, 8, required=False),  # pod mode: the plan digest
}

# A node's console (``lines``, xrun.channel.messages): records of a rank set and its text. A node merges only its own
# ranks' lines, and reads its ranks' pipes a megabyte at a time: a record far past these bounds is no node's.
LINE_RECORDS = 1 << 16  # records in one message (the sender splits at it)
LINES_TEXT = 4 << 20  # characters of text in one message, that many records together (the sender splits at it)
RECORD_TEXT = 8 << 20  # characters of one record's text (a node's record is at most two of its reads)
MAX_LOCAL_RANKS = 1 << 10  # a node's own ranks: at most MAX_SLOTS_PER_HOST (xrun.strict_numbers)
RECORD_RANKS = MAX_LOCAL_RANKS  # ranks one record names: a node's own
MAX_RANK = 1 << 17  # MAX_RANKS (xrun.strict_numbers)

LINES_FIELDS: Mapping[str, Field] = {
    "fd": Field(FieldKind.INT, 2),  # 1 or 2 (lines_of checks which)
    "host": Field(FieldKind.TEXT, 255),  # the label's host; it reaches the console
    "lines": Field(FieldKind.LIST, LINE_RECORDS),
}


def record_problem(record: Any) -> str | None:
    """Why one ``[ranks, text]`` record does not fit, or None: a list of at most ``RECORD_RANKS`` integers from 0 to
    ``MAX_RANK``, and text of at most ``RECORD_TEXT`` characters."""
    if not isinstance(record, list) or len(record) != 2:
        return "expected [ranks, text]"
    ranks, text = record
    if not isinstance(ranks, list) or len(ranks) > RECORD_RANKS:
        return f"expected a list of at most {RECORD_RANKS} ranks"
    for rank in ranks:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= MAX_RANK:
            return f"expected ranks from 0 to {MAX_RANK}"
    if not isinstance(text, str) or len(text) > RECORD_TEXT:
        return f"expected text of at most {RECORD_TEXT} characters"
    return None


# what an admitted agent reports of its ranks (issue 31): one item per local rank
COLLECTIVES_FIELDS: Mapping[str, Field] = {
    "ranks": Field(FieldKind.LIST, MAX_LOCAL_RANKS),
    "file": Field(FieldKind.TEXT, 4096, required=False),  # where the full records are on the node (a path)
}
ENTRY_TIMES_FIELDS: Mapping[str, Field] = {"ranks": Field(FieldKind.LIST, MAX_LOCAL_RANKS)}
# each rank's CPU and memory while it runs (issue 40 §1; its items: xrun.common.telemetry.usage.read_usage)
USAGE_FIELDS: Mapping[str, Field] = {"ranks": Field(FieldKind.LIST, MAX_LOCAL_RANKS)}
PONG_FIELDS: Mapping[str, Field] = {"clock_ns": Field(FieldKind.INT, (1 << 63) - 1, required=False)}
