"""The head's console (issue 17, issue 30 §3): every node's line records rendered and merged in one place
(xrun.common.output.render.JobConsole), and what the backends' own streams carry relayed in whole lines
(xrun.runner.job.relay.StreamLines)."""

import time

import pytest

from xrun.common.output.dedupe import FLOOD_LINES
from xrun.common.output.render import JobConsole, Lines, first_line_end, labelled, render_lines
from xrun.runner.job.relay import StreamLines


class Console:
    """A JobConsole writing into a list: (fd, bytes) per write."""

    def __init__(self, **options):
        self.writes = []
        self.job = JobConsole(lambda fd, data: self.writes.append((fd, data)), **options)

    def add(self, node, host, *records, fd=1):
        self.job.add(("node", node), fd, Lines(host, records), time.monotonic())

    def text(self):
        return b"".join(data for _, data in self.writes)

    def lines(self):
        self.job.close()
        return self.text().splitlines()


def test_a_nodes_records_are_labelled_with_its_host_and_rank_sets():
    console = Console()
    console.add(0, "n1", ((0, 1, 2, 5), b"warn\n"), ((3,), b"a\nb\n"), ((), b"xrun[n1]: a notice\n"), fd=2)
    assert console.writes == [(2, b"[n1:0-2,5] warn\n[n1:3] a\n[n1:3] b\nxrun[n1]: a notice\n")]


def test_render_lines_labels_every_line_and_a_bars_states():
    assert render_lines(Lines("h", (((0,), b"\r 10%\r 20%\r\ndone\n"),))) == b"[h:0] \r[h:0]  10%\r[h:0]  20%\r\n[h:0] done\n"
    assert render_lines(Lines("h", (((1,), b" 42%"),))) == b"[h:1]  42%"  # a state shown before its line end
    assert labelled(b"[p] ", b"") == b"" and labelled(b"", b"a\n") == b"a\n"


@pytest.mark.parametrize(("text", "end"), [(b"a\nb", 2), (b"a\rb", 2), (b"a\r\nb", 3), (b"ab", 2), (b"\n", 1)])
def test_first_line_end(text, end):
    assert first_line_end(text) == end


# ---------------------------------------------------------------------------------------------------------------
# A backend's own stream: whole lines, never another node's line cut in two.


def test_split_lines_of_two_streams_never_interleave():
    console = Console()
    a, b = StreamLines(console.job, "a", 1), StreamLines(console.job, "b", 1)
    for stream, piece in ((a, b"hel"), (b, b"wor"), (a, b"lo\nx"), (b, b"ld\n"), (a, b"y\n")):
        stream.feed(piece)
    assert console.text().split(b"\n") == [b"hello", b"world", b"xy", b""]


def test_last_line_without_newline_is_flushed_at_the_end():
    console = Console()
    stream = StreamLines(console.job, "a", 2)
    stream.feed(b"one\ntwo")
    stream.flush()
    assert console.writes == [(2, b"one\n"), (2, b"two")]


def test_non_utf8_bytes_pass_through():
    console = Console()
    stream = StreamLines(console.job, "a", 1)
    stream.feed(b"\xff\xfe")
    stream.feed(b"\n")
    assert console.text() == b"\xff\xfe\n"


def test_endless_line_is_passed_on_in_pieces():
    console = Console()
    StreamLines(console.job, "a", 1).feed(b"x" * (1 << 20))  # no newline, but at the bound: written at once
    assert len(console.text()) == 1 << 20


def test_a_streams_text_keeps_its_place_after_the_lines_the_merger_holds():
    console = Console(merge=True, window=10.0)
    console.add(0, "n1", ((0,), b"held\n"))
    StreamLines(console.job, ("ssh", "n1", 2), 2).feed(b"ssh: something went wrong\n")
    assert console.writes == []  # held for its twins, and the stream's line after it
    assert console.lines() == [b"[n1:0] held", b"ssh: something went wrong"]


# ---------------------------------------------------------------------------------------------------------------
# Progress bars: a node's unfinished state is shown as it comes, and never has another line written onto it.


def test_a_progress_bars_state_is_shown_at_once_and_another_nodes_line_does_not_land_on_it():
    console = Console()
    console.add(0, "n1", ((0,), b"\r"))
    console.add(0, "n1", ((0,), b"progress 1/3 |#  |"))
    assert console.text() == b"[n1:0] \r[n1:0] progress 1/3 |#  |"
    console.add(1, "n2", ((1,), b"a line\n"))
    assert console.text().endswith(b"|#  |\r[n2:1] a line\n")  # the state ended with \r first, as a bar's update
    console.add(0, "n1", ((), b"\r"), ((0,), b"progress 3/3 |###|\n"))  # ended by the node, then the line in full
    assert console.text().endswith(b"\r[n2:1] a line\n\r[n1:0] progress 3/3 |###|\n")


def test_the_rest_of_a_shown_state_follows_it_directly():
    console = Console(merge=True, window=10.0)
    console.add(1, "n2", ((1,), b"held\n"))
    console.add(0, "n1", ((0,), b" 42%"))  # after what is held: the held line goes first
    console.add(0, "n1", ((), b"|##|"), ((), b"\r"))  # the state grew, then its line ended
    assert console.text() == b"[n2:1] held\n[n1:0]  42%|##|\r"


# ---------------------------------------------------------------------------------------------------------------
# The merge across nodes (issue 17): each node's records, merged by the one merger of the job.


def test_the_same_line_from_every_node_is_shown_once_with_its_ranks():
    console = Console(merge=True, window=10.0)
    console.add(0, "n1", ((0, 1), b"warn\n"), ((0,), b"own 0\n"))
    console.add(1, "n2", ((2, 3), b"warn\n"))
    console.add(2, "n3", ((4,), b"warn\n"))
    console.add(1, "n2", ((2,), b"own 2\n"))
    assert console.lines() == [b"[ranks 0-4] warn", b"[n1:0] own 0", b"[n2:2] own 2"]


def test_lines_of_no_rank_pass_unmerged_in_their_place():
    console = Console(merge=True, window=10.0)
    console.add(0, "n1", ((0,), b"a\n"), ((), b"xrun[n1]: notice\n"), ((0,), b"b\n"))
    console.add(1, "n2", ((), b"xrun[n2]: notice\n"), ((1,), b"b\n"))
    assert console.lines() == [b"[n1:0] a", b"xrun[n1]: notice", b"xrun[n2]: notice", b"[ranks 0-1] b"]


def test_a_flood_at_the_head_is_written_as_it_comes_after_what_is_held():
    console = Console(merge=True, window=10.0)
    flood = b"".join(b"line %d\n" % i for i in range(FLOOD_LINES + 1))
    console.add(1, "n2", ((1,), b"held\n"))
    console.add(0, "n1", ((0,), flood))
    console.add(1, "n2", ((1,), b"after\n"))
    out = console.lines()
    assert out[0] == b"[n2:1] held" and out[1] == b"[n1:0] line 0" and out[-1] == b"[n2:1] after"
    assert len(out) == FLOOD_LINES + 3


def test_a_progress_update_is_never_merged():
    console = Console(merge=True, window=10.0)
    console.add(0, "n1", ((0,), b"42%\r"))
    console.add(1, "n2", ((1,), b"42%\r"))
    assert console.lines() == [b"[n1:0] 42%", b"[n2:1] 42%"]


def test_the_head_waits_for_the_other_nodes_copies_of_a_line_several_ranks_said():
    """One node's copy of a shared line already names several ranks: the head waits up to the late window for the
    other nodes' copies (nodes start apart), and writes the line as soon as every rank has said it."""
    console = Console(merge=True, expected=6)
    started = time.monotonic()
    console.add(0, "n1", ((0, 1), b"warn\n"))
    console.job.flush(started + 0.5)  # more than a window later: still held for the other nodes
    assert console.writes == []
    console.add(1, "n2", ((2, 3), b"warn\n"))
    console.add(2, "n3", ((4, 5), b"warn\n"))
    console.job.flush(time.monotonic())  # complete: due at once
    assert console.writes == [(1, b"[ranks 0-5] warn\n")]
