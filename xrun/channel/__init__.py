"""The control channel: the wire both layers speak (framing, message kinds, socket liveness, authentication).

The bottom layer: ``xrun.runner`` and ``xrun.launch`` both import it; it imports neither (only the standard
library and ``xrun``'s shared modules). What it offers is re-exported here, so ``from xrun import channel`` then
``channel.send(sock, channel.message(channel.Kind.READY))`` reads as the protocol does.
"""

from xrun.channel.auth import token_matches
from xrun.channel.framing import (
    HEADER,
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
from xrun.channel.messages import STOP_STACKS, Kind, message, output_bytes, output_message
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
    "MAX_FRAME",
    "MAX_HELLO",
    "PING_INTERVAL",
    "STOP_STACKS",
    "USER_TIMEOUT",
    "ChannelError",
    "FrameReader",
    "Kind",
    "Message",
    "decode_body",
    "encode",
    "message",
    "output_bytes",
    "output_message",
    "recv",
    "send",
    "token_matches",
    "tune_socket",
]
