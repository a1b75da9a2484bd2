import os
import tempfile
import time

from xrun.launch.output.writer import writer
from xrun.runner.job.relay import LineRelay


def relayed(pieces_by_stream):
    """Feed interleaved pieces of several streams through their relays into one file; return what came out."""
    with tempfile.TemporaryFile() as sink:
        relays = {}
        for name, piece in pieces_by_stream:
            relays.setdefault(name, LineRelay(sink.fileno())).feed(piece)
        for relay in relays.values():
            relay.flush()
        writer().drain()  # the head queues its console writes (issue 25 §3)
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
        writer().drain()
        assert os.fstat(sink.fileno()).st_size == 1 << 20


def test_a_progress_bars_state_is_relayed_at_once_not_at_its_line_end():
    """A node shows a \r bar's unfinished state once settled (issue 25); the head passes it on as it comes, while
    an ordinary partial line still waits for its newline (lines of two nodes never interleave)."""
    with tempfile.TemporaryFile() as sink:
        def seen():
            writer().drain()  # the head queues its console writes (issue 25 §3)
            sink.seek(0)
            return sink.read()

        bar, plain = LineRelay(sink.fileno()), LineRelay(sink.fileno())
        bar.feed(b"[n1:0] \rprogress 1/3 |#  |")
        assert seen() == b"[n1:0] \rprogress 1/3 |#  |"
        plain.feed(b"[n2:1] half a li")
        bar.feed(b"\rprogress 3/3 |###|")
        assert seen().endswith(b"\rprogress 3/3 |###|") and b"half" not in seen()
        bar.feed(b"\n")
        plain.feed(b"ne\n")
        assert seen() == b"[n1:0] \rprogress 1/3 |#  |\rprogress 3/3 |###|\n[n2:1] half a line\n"


def test_a_progress_bars_state_goes_after_the_lines_the_merger_holds():
    from xrun.launch.output.dedupe import LineMerger

    with tempfile.TemporaryFile() as sink:
        merger = LineMerger(os.write, window=10.0)
        LineRelay(sink.fileno(), merger=merger, source="n2").feed(b"[n2:1] a warning\n")
        LineRelay(sink.fileno(), merger=merger, source="n1").feed(b"[n1:0] \rstep 2/9")
        writer().drain()  # the head queues its console writes (issue 25 §3)
        sink.seek(0)
        assert sink.read() == b"[n2:1] a warning\n[n1:0] \rstep 2/9"  # the bar now, the held line first


# ---------------------------------------------------------------------------------------------------------------
# The head's merge across nodes (issue 17): agents' labelled lines, merged by the one merger of the job.


def merged(pieces_by_host):
    from xrun.launch.output.dedupe import LineMerger

    with tempfile.TemporaryFile() as sink:
        merger = LineMerger(os.write, window=10.0)
        relays = {}
        for host, piece in pieces_by_host:
            relays.setdefault(host, LineRelay(sink.fileno(), merger=merger, source=host)).feed(piece)
        for relay in relays.values():
            relay.flush()
        merger.flush_all()
        writer().drain()  # the head queues its console writes (issue 25 §3)
        sink.seek(0)
        return sink.read().splitlines()


def test_the_same_line_from_every_node_is_shown_once_with_its_ranks():
    out = merged([("n1", b"[n1:0-1] warn\n[n1:0] own 0\n"), ("n2", b"[n2:2-3] wa"), ("n3", b"[n3:4] warn\n"),
                  ("n2", b"rn\n[n2:2] own 2\n")])
    assert out == [b"[ranks 0-4] warn", b"[n1:0] own 0", b"[n2:2] own 2"]


def test_unlabelled_lines_pass_unmerged_in_their_place():
    out = merged([("n1", b"[n1:0] a\nxrun[n1]: notice\n[n1:0] b\n"), ("n2", b"xrun[n2]: notice\n[n2:1] b\n")])
    assert out == [b"[n1:0] a", b"xrun[n1]: notice", b"xrun[n2]: notice", b"[ranks 0-1] b"]


def test_read_label():
    from xrun.runner.job.relay import read_label

    assert read_label(b"[h:0-2,5] text\n") == ("h", [0, 1, 2, 5], b"text\n")
    assert read_label(b"[fe80::1:3] x\n") == ("fe80::1", [3], b"x\n")
    assert read_label(b"[not a label] x\n") == ("", [], b"[not a label] x\n")
    assert read_label(b"plain\n") == ("", [], b"plain\n")


def test_pod_mode_node_lines_merge_every_nodes_writes_on_node_0():
    """Node 0's server (xrun.runner.pod.node0_server) gets each node's console writes as messages, split anywhere."""
    from xrun.launch.output.dedupe import LineMerger
    from xrun.runner.job.relay import NodeLines

    with tempfile.TemporaryFile() as sink:
        lines = NodeLines(LineMerger(lambda fd, data: os.write(sink.fileno(), data), window=10.0))
        lines.feed("n1", 1, b"[n1:0-1] warn\n[n1:0] ow")
        lines.feed("n2", 1, b"[n2:2-3] warn\nxrun[n2]: a notice\n")
        lines.feed("n1", 1, b"n 0\n[n1:1] last without newline")
        lines.close()
        writer().drain()  # the head queues its console writes (issue 25 §3)
        sink.seek(0)
        # n1's "own 0" was complete only after n2's notice
        assert sink.read().splitlines() == [b"[ranks 0-3] warn", b"xrun[n2]: a notice", b"[n1:0] own 0",
                                            b"[n1:1] last without newline"]


def test_a_flood_at_the_head_is_written_as_it_comes_after_what_is_held():
    from xrun.launch.output.dedupe import FLOOD_LINES

    flood = b"".join(b"[n1:0] line %d\n" % i for i in range(FLOOD_LINES + 1))
    out = merged([("n2", b"[n2:1] held\n"), ("n1", flood), ("n2", b"[n2:1] after\n")])
    assert out[0] == b"[n2:1] held" and out[1] == b"[n1:0] line 0" and out[-1] == b"[n2:1] after"
    assert len(out) == FLOOD_LINES + 3


def test_the_head_waits_for_the_other_nodes_copies_of_a_line_several_ranks_said():
    """One node's copy of a shared line already names several ranks: the head waits up to the late window for the
    other nodes' copies (nodes start apart), and writes the line as soon as every rank has said it."""
    from xrun.launch.output.dedupe import LineMerger
    from xrun.runner.job.relay import NodeLines

    out = []
    lines = NodeLines(LineMerger(lambda fd, data: out.append(data), expected=6))
    started = time.monotonic()
    lines.feed("n1", 1, b"[n1:0-1] warn\n")
    lines.merger.flush(started + 0.5)  # more than a window later: still held for the other nodes
    assert out == []
    lines.feed("n2", 1, b"[n2:2-3] warn\n")
    lines.feed("n3", 1, b"[n3:4-5] warn\n")
    lines.merger.flush(time.monotonic())  # complete: due at once
    assert out == [b"[ranks 0-5] warn\n"]
