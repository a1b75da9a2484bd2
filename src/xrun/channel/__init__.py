"""The control channel: the wire both layers speak (framing, message kinds, socket liveness; TLS and
the challenge-response in their own modules, loaded only by code that opens a channel).

The bottom layer: ``xrun.runner`` and ``xrun.launch`` both import it; it imports neither (only the standard
library, ``cryptography`` in ``tls_server.ServerIdentity.mint``, and ``xrun``'s shared modules). What it offers
is re-exported here, so ``from xrun import channel`` then ``channel.send(sock, channel.message(channel.Kind.READY))``
reads as the protocol does.

Security (issue 22), one module per question: ``framing`` (any bytes give a message or a ``ChannelError``),
``fields`` (a stranger's fields have sane shapes), ``tls`` and ``tls_server`` (TLS 1.3, a per-run certificate,
pinning), ``proof`` (challenge-response over fresh nonces, bound to the certificate), ``handshake`` (who proves
what, when), ``admission`` (how many strangers, how many failed guesses). Only the wire is re-exported here: the
TLS modules import ``ssl`` (~5-7 ms) and the server's modules (``admission``, ``tls_server``) are no agent's
business, so code that opens a channel imports what it needs itself, and a local run never loads any of it.
"""

from xrun.channel.framing import (
    HEADER,
    MAX_DEPTH,
    MAX_FRAME,
    MAX_HELLO,
    ChannelError,
    FrameReader,
    Message,
    decode_body,
    encode,
    recv,
    send,
)
from xrun.channel.messages import STOP_STACKS, Kind, Reader, lines_messages, lines_of, message
from xrun.channel.sockets import (
    DEAD_AFTER,
    HELLO_TIMEOUT,
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE,
    KEEPALIVE_INTERVAL,
    PING_INTERVAL,
    USER_TIMEOUT,
    tune_socket,
)

__all__ = [
    "DEAD_AFTER",
    "HEADER",
    "HELLO_TIMEOUT",
    "KEEPALIVE_COUNT",
    "KEEPALIVE_IDLE",
    "KEEPALIVE_INTERVAL",
    "MAX_DEPTH",
    "MAX_FRAME",
    "MAX_HELLO",
    "PING_INTERVAL",
    "STOP_STACKS",
    "USER_TIMEOUT",
    "ChannelError",
    "FrameReader",
    "Kind",
    "Message",
    "Reader",
    "decode_body",
    "encode",
    "lines_messages",
    "lines_of",
    "message",
    "recv",
    "send",
    "tune_socket",
]
