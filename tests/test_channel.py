"""The control channel's wire format and authentication."""

import json
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xrun import channel
from xrun.channel import ChannelError, FrameReader, Kind, decode_body, encode, fields, message
from xrun.channel.fields import AUTH_FIELDS, CHALLENGE_FIELDS, HELLO_FIELDS, fields_error

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


_records = st.lists(st.tuples(st.lists(st.integers(0, fields.MAX_RANK), max_size=8), st.binary(max_size=256)),
                    min_size=1, max_size=8)


@given(_records, st.sampled_from([1, 2]), st.text(max_size=20).filter(str.isprintable))
def test_a_lines_message_carries_any_bytes_unchanged(records, fd, host):
    """A node's console (xrun.common.output.consoleroute): whatever a rank wrote reaches the head byte for byte, with
    its rank set."""
    got = []
    for msg in channel.lines_messages(fd, host, records):
        (decoded,) = FrameReader().feed(encode(msg))
        got.append(channel.lines_of(decoded))
    assert [(f, h) for f, h, _ in got] == [(fd, host)] * len(got)
    assert [record for _, _, part in got for record in part] == [(list(ranks), text) for ranks, text in records]


def test_a_big_console_write_is_split_into_messages_well_inside_a_frame():
    records = [((0,), b"x" * (1 << 20) + b"\n")] * 9 + [((1,), b"y\n")] * (fields.LINE_RECORDS + 1)
    msgs = list(channel.lines_messages(1, "h", records))
    assert len(msgs) >= 4
    assert all(len(m["lines"]) <= fields.LINE_RECORDS and len(encode(m)) < channel.MAX_FRAME for m in msgs)
    assert [r for m in msgs for r in channel.lines_of(m)[2]] == [(list(ranks), text) for ranks, text in records]


def _lines(**fields_):
    return {"type": "lines", "fd": 1, "host": "h", "lines": [[[0], "x\n"]], **fields_}


@pytest.mark.parametrize("msg", [
    _lines(fd=3), _lines(fd=True), _lines(fd=0), {"type": "lines", "host": "h", "lines": []}, _lines(host=7),
    _lines(host="h\x1b[2J"), _lines(host="h" * 256), _lines(lines="x\n"), _lines(lines=[["x\n"]]),
    _lines(lines=[[0, "x\n"]]), _lines(lines=[[[-1], "x"]]), _lines(lines=[[[True], "x"]]),
    _lines(lines=[[[fields.MAX_RANK + 1], "x"]]), _lines(lines=[[list(range(fields.RECORD_RANKS + 1)), "x"]]),
    _lines(lines=[[[0], 7]]), _lines(lines=[[[0], "x" * (fields.RECORD_TEXT + 1)]]),
    _lines(lines=[[[0], "\ud800"]]), _lines(lines=[[[0], "x"]] * (fields.LINE_RECORDS + 1)),
])
def test_a_malformed_lines_message_is_a_protocol_error(msg):
    with pytest.raises(ChannelError, match="lines"):
        channel.lines_of(msg)


# ---------------------------------------------------------------------------------------------------------------
# Hostile input (issue 22): any bytes are a message or a ChannelError, never another exception.

# st.text() never draws a lone surrogate: mix some in, with the characters JSON must escape.
TEXT = st.text(max_size=8) | st.text(st.sampled_from("a\u00e9\ud800\udcff\udfff\x00\x1b\"\\"), max_size=6)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=40,
)
# Mostly messages with a string type, so that the checks past the first one are reached too.
AS_OBJECT = st.builds(lambda kind, rest: {**rest, "type": kind}, TEXT | ANY_JSON,
                      st.dictionaries(st.sampled_from(["node_rank", "proof", "client_nonce"]) | TEXT, ANY_JSON, max_size=4))


def _dump(value, ascii_only):
    """JSON as a peer might send it: escaped (``\\ud800``) or raw (surrogatepass bytes) lone surrogates included."""
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True).encode("utf-8", "surrogatepass")


def _decoded_or_refused(body, strict):
    """The message decode_body makes of ``body``, or None for a ChannelError; any other exception fails the test."""
    try:
        msg = decode_body(body, strict=strict)
    except ChannelError:
        return None
    assert isinstance(msg, dict) and isinstance(msg["type"], str)
    if strict:  # what a stranger got through encodes: no later check can trip on a lone surrogate
        json.dumps(msg, ensure_ascii=False, allow_nan=False).encode("utf-8")
    return msg


@given(st.binary(max_size=2048), st.booleans())
def test_any_bytes_decode_to_a_message_or_a_channel_error(body, strict):
    _decoded_or_refused(body, strict)


@given(ANY_JSON | AS_OBJECT, st.booleans(), st.booleans())
def test_any_json_decodes_to_a_message_or_a_channel_error(value, ascii_only, strict):
    body = _dump(value, ascii_only)
    msg = _decoded_or_refused(body, strict)
    if msg is not None:  # what JSON says (escaped "\ud800\udcff" is one character: a pair)
        assert msg == json.loads(body.decode("utf-8", "surrogatepass"))


def _frames(draw_bodies):
    return b"".join(channel.HEADER.pack(len(body)) + body for body in draw_bodies)


DEEP = st.tuples(st.integers(1, 3000), st.sampled_from([b"[", b'{"type":"x","a":['])).map(lambda t: t[1] * t[0])
BODIES = st.lists(st.binary(max_size=64) | DEEP | (ANY_JSON | AS_OBJECT).map(lambda v: _dump(v, False)), max_size=6)


@given(BODIES, st.binary(max_size=16), st.lists(st.integers(1, 97), min_size=1, max_size=40), st.booleans())
def test_a_reader_fed_any_stream_in_any_chunks_yields_messages_or_a_channel_error(bodies, tail, steps, strict):
    data = _frames(bodies) + tail
    reader = FrameReader(channel.MAX_HELLO, strict=strict)
    at, step = 0, 0
    while at < len(data):
        size = steps[step % len(steps)]
        try:
            out = reader.feed(data[at : at + size])
        except ChannelError:
            return  # the connection is dropped: nothing else happens
        assert all(isinstance(msg, dict) and isinstance(msg["type"], str) for msg in out)
        at, step = at + size, step + 1


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("body", [b"[" * 50_000, b'{"type":"x","a":' + b"[" * 50_000, b'{"a":' * 20_000],
                         ids=["lists", "in-object", "objects"])
def test_deep_nesting_is_a_channel_error(body, strict):
    """Issue 22: 50 KB of ``[`` raised RecursionError out of the control server's loop and ended the job."""
    with pytest.raises(ChannelError, match="undecodable"):
        decode_body(body, strict=strict)


def _nested(depth):
    """A message whose deepest value sits ``depth`` containers down (the message itself is one)."""
    return {"type": "x", "v": json.loads("[" * (depth - 1) + "]" * (depth - 1))} if depth > 1 else {"type": "x"}


def test_nesting_up_to_max_depth_is_fine_one_more_is_refused():
    body = json.dumps(_nested(channel.MAX_DEPTH)).encode()
    assert decode_body(body, strict=True) == _nested(channel.MAX_DEPTH)
    with pytest.raises(ChannelError, match=f"deeper than {channel.MAX_DEPTH}"):
        decode_body(json.dumps(_nested(channel.MAX_DEPTH + 1)).encode())


SURROGATE_ESCAPED = b'{"type":"hello","token":"\\ud800"}'
SURROGATE_RAW = '{"type":"hello","token":"\udcff"}'.encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("body", [SURROGATE_ESCAPED, SURROGATE_RAW, b'{"type":"x","\\udc80":1}',
                                  b'{"type":"x","a":[{"b":"ok \\udfff"}]}'])
def test_a_stranger_cannot_send_a_lone_surrogate(body):
    """Issue 22: a hello whose token was ``"\\ud800"`` raised UnicodeEncodeError in the token check."""
    with pytest.raises(ChannelError, match="undecodable"):
        decode_body(body, strict=True)
    assert decode_body(body, strict=False)  # a proven peer's non-UTF-8 bytes travel as surrogates (see below)


def test_a_surrogate_pair_is_not_a_lone_surrogate():
    assert decode_body(b'{"type":"x","e":"\\ud83d\\ude00"}', strict=True)["e"] == "\U0001f600"


@pytest.mark.parametrize("body", [b'{"type":"x","n":NaN}', b'{"type":"x","n":Infinity}', b'{"type":"x","n":-Infinity}',
                                  b'{"type":"x","n":1e999}', b'{"type":"x","n":-1e999}',
                                  b'{"type":"x","n":' + b"9" * 5000 + b"}", b'{"type":"x","n":-' + b"1" * 41 + b"}"])
def test_numbers_json_does_not_have_or_that_cost_time_are_refused(body):
    with pytest.raises(ChannelError, match="undecodable"):
        decode_body(body)


def test_big_but_sane_numbers_pass():
    msg = decode_body(b'{"type":"x","n":-' + b"9" * 39 + b',"f":1e300}')
    assert msg["n"] == -int("9" * 39) and msg["f"] == 1e300


@pytest.mark.parametrize("body", [b'{"type":1}', b'{"type":null}', b'{"type":["hello"]}', b'"hello"', b"null", b""])
def test_a_message_needs_a_string_type(body):
    with pytest.raises(ChannelError):
        decode_body(body, strict=True)


def test_a_stranger_reader_is_small_and_strict_until_trusted():
    reader = FrameReader.stranger()
    assert (reader.limit, reader.strict) == (channel.MAX_HELLO, True)
    with pytest.raises(ChannelError, match="undecodable"):
        reader.feed(channel.HEADER.pack(len(SURROGATE_RAW)) + SURROGATE_RAW)
    reader = FrameReader.stranger()
    reader.trust()
    assert (reader.limit, reader.strict) == (channel.MAX_FRAME, False)
    assert reader.feed(channel.HEADER.pack(len(SURROGATE_RAW)) + SURROGATE_RAW) == [{"type": "hello", "token": "\udcff"}]


# ---------------------------------------------------------------------------------------------------------------
# Field shapes of a stranger's messages (xrun.channel.fields).

NONCE_HEX = "ab" * 32
GOOD_AUTH = {"type": "auth", "client_nonce": NONCE_HEX, "node_rank": 3}


def test_a_good_auth_fits():
    assert fields_error(GOOD_AUTH, AUTH_FIELDS) is None
    assert fields_error({**GOOD_AUTH, "future": [1]}, AUTH_FIELDS) is None  # extra fields: ignored


@pytest.mark.parametrize(("name", "value"), [
    ("client_nonce", None), ("client_nonce", "AB" * 32), ("client_nonce", "ab" * 31), ("client_nonce", "ab" * 33),
    ("client_nonce", "zz" * 32), ("client_nonce", "\ud800" * 64), ("client_nonce", ["ab" * 32]),
    ("client_nonce", "١" * 64),  # Arabic-Indic digits: str.isdigit() would say yes
    ("node_rank", True), ("node_rank", -1), ("node_rank", 1.0), ("node_rank", "1"), ("node_rank", 1 << 40),
])
def test_a_misshapen_auth_field_is_named(name, value):
    err = fields_error({**GOOD_AUTH, name: value}, AUTH_FIELDS)
    assert isinstance(err, ChannelError) and repr(name) in err.reason


@pytest.mark.parametrize("name", ["client_nonce", "node_rank"])
def test_a_missing_auth_field_is_named(name):
    msg = {k: v for k, v in GOOD_AUTH.items() if k != name}
    err = fields_error(msg, AUTH_FIELDS)
    assert isinstance(err, ChannelError) and f"no {name!r}" in err.reason


GOOD_HELLO = {"type": "hello", "proof": "0f" * 32, "node_rank": 0, "host": "node-1.example", "pid": 4242,
              "addr": "fe80::1%eth0", "versions": {"xrun": "0.1.0"}}


@pytest.mark.parametrize(("name", "value", "fits"), [
    ("host", "x" * 255, True), ("host", "x" * 256, False), ("host", "evil\x1b[2Jhost", False), ("host", "a\nb", False),
    ("host", "nœud", True), ("host", "n\udcffd", False), ("pid", 0, True), ("pid", 1 << 31, False),
    ("versions", {}, True), ("versions", {str(i): i for i in range(17)}, False), ("versions", [], False),
    ("digest", {"fields": {}, "sha256": "x"}, True), ("digest", "x", False),
])
def test_hello_fields(name, value, fits):
    assert (fields_error({**GOOD_HELLO, name: value}, HELLO_FIELDS) is None) is fits


def test_the_challenge_proof_is_optional_but_shaped():
    challenge = {"type": "challenge", "server_nonce": NONCE_HEX}
    assert fields_error(challenge, CHALLENGE_FIELDS) is None
    assert fields_error({**challenge, "server_proof": "00" * 32}, CHALLENGE_FIELDS) is None
    assert fields_error({**challenge, "server_proof": None}, CHALLENGE_FIELDS) is not None


@given(AS_OBJECT, st.sampled_from(["AUTH_FIELDS", "CHALLENGE_FIELDS", "HELLO_FIELDS"]))
def test_any_object_gets_a_verdict_never_an_exception(msg, table):
    verdict = fields_error(msg, getattr(fields, table))
    assert verdict is None or isinstance(verdict, ChannelError)


def test_a_strangers_strings_in_a_refusal_are_short_and_escaped():
    err = fields_error({"type": "\x1b[2J" + "x" * 100}, AUTH_FIELDS)
    assert "\x1b" not in err.reason and "\\x1b" in err.reason and len(err.reason) < 60
