"""The control channel's wire format and authentication."""

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xrun import channel
from xrun.channel import ChannelError, FrameReader, Kind, encode, message, token_matches

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(st.lists(st.dictionaries(st.text(max_size=8), JSON, max_size=4), max_size=5), st.integers(1, 7))
def test_frames_round_trip_in_any_chunking(payloads, step):
    msgs = [{**p, "type": "x"} for p in payloads]
    data = b"".join(encode(m) for m in msgs)
    reader = FrameReader()
    out = []
    for i in range(0, len(data), step):
        out += reader.feed(data[i : i + step])
    assert out == msgs and reader.pending == 0


def test_frame_is_big_endian_length_then_json():
    assert encode(message(Kind.PING)) == b"\x00\x00\x00\x0f" + b'{"type":"ping"}'


def test_env_values_survive_byte_exact():
    values = ["a b", "it's", '"q"', "$(id)", "back\\slash", "l1\nl2", "ünï ✓", "\udcff\udc80"]  # last: not UTF-8
    [msg] = FrameReader().feed(encode(message(Kind.SPEC, env=values)))
    assert msg["env"] == values


@pytest.mark.parametrize("body", [b"\xff\xfe", b"[1]", b'{"no": "type"}', b"not json"])
def test_garbage_is_a_channel_error(body):
    with pytest.raises(ChannelError):
        FrameReader().feed(channel.HEADER.pack(len(body)) + body)


def test_oversized_frame_refused_before_reading_it():
    reader = FrameReader(limit=channel.MAX_HELLO)
    with pytest.raises(ChannelError, match="exceeds"):
        reader.feed(channel.HEADER.pack(channel.MAX_HELLO + 1))


def test_token_check_is_strict():
    assert token_matches("abc", "abc")
    for bad in ("abd", "ab", "abcd", "", None, 123, ["abc"]):
        assert not token_matches("abc", bad)


def test_blocking_recv_keeps_messages_that_arrive_together():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(encode(message(Kind.SPEC, n=1)) + encode(message(Kind.START, n=2)))
        reader = FrameReader()
        assert channel.recv(b, reader, timeout=1)["n"] == 1
        assert channel.recv(b, reader, timeout=1)["n"] == 2
        with pytest.raises(ChannelError, match="no message"):
            channel.recv(b, reader, timeout=0.05)
        a.close()
        with pytest.raises(ChannelError, match="closed"):
            channel.recv(b, reader, timeout=1)


@given(st.binary(max_size=512), st.sampled_from([1, 2]))
def test_an_output_message_carries_any_bytes_unchanged(data, fd):
    """Pod mode's console lines (xrun.launch.output.consoleroute): whatever a rank wrote reaches node 0 byte for byte."""
    frame = encode(channel.output_message(fd, data))
    (msg,) = FrameReader().feed(frame)
    assert channel.output_bytes(msg) == (fd, data)


@pytest.mark.parametrize("msg", [{"type": "output", "fd": 3, "text": "x"}, {"type": "output", "fd": True, "text": ""},
                                 {"type": "output", "fd": 1, "text": 7}, {"type": "output"}])
def test_a_malformed_output_message_is_a_protocol_error(msg):
    with pytest.raises(ChannelError, match="output"):
        channel.output_bytes(msg)
