import os
import tempfile

from xrun.runner.relay import LineRelay


def relayed(pieces_by_stream):
    """Feed interleaved pieces of several streams through their relays into one file; return what came out."""
    with tempfile.TemporaryFile() as sink:
        relays = {}
        for name, piece in pieces_by_stream:
            relays.setdefault(name, LineRelay(sink.fileno())).feed(piece)
        for relay in relays.values():
            relay.flush()
        sink.seek(0)
        return sink.read()


def test_split_lines_of_two_nodes_never_interleave():
    out = relayed([("a", b"[n1:0] hel"), ("b", b"[n2:2] wor"), ("a", b"lo\n[n1:0] x"), ("b", b"ld\n"), ("a", b"y\n")])
    assert out.split(b"\n") == [b"[n1:0] hello", b"[n2:2] world", b"[n1:0] xy", b""]


def test_last_line_without_newline_is_flushed_at_the_end():
    assert relayed([("a", b"one\ntwo")]) == b"one\ntwo"


def test_non_utf8_bytes_pass_through():
    assert relayed([("a", b"\xff\xfe"), ("a", b"\n")]) == b"\xff\xfe\n"


def test_endless_line_is_passed_on_in_pieces():
    with tempfile.TemporaryFile() as sink:
        relay = LineRelay(sink.fileno())
        relay.feed(b"x" * (1 << 20))  # no newline, but at the bound: written without waiting for the end
        assert os.fstat(sink.fileno()).st_size == 1 << 20
