"""Where a node's console goes (xrun.common.output.consoleroute): local fds, rendered there, or its line records over
the channel to the head (pod mode: node 0), and kept here too on pod mode's other nodes."""

import os

import pytest

from xrun.common.output import consoleroute
from xrun.common.output.consoleroute import Route, routed
from xrun.common.output.render import Lines, raw
from xrun.common.output.writer import console_lines, console_write, writer

RECORDS = Lines("h", (((0, 1, 2), b"shared\n"), ((3,), b"own\n"), ((), b"xrun[h]: a notice\n")))
RENDERED = b"[h:0-2] shared\n[h:3] own\nxrun[h]: a notice\n"


def _pipe_write(route, data=b"line\n"):
    """A console write (text with console_write, records with console_lines) to fd 1 under ``route``, with fd 1 on
    a pipe; what reached the pipe and what went along."""
    sent = []
    r, w = os.pipe()
    saved = os.dup(1)
    try:
        os.dup2(w, 1)
        with routed(None if route is None else Route(lambda fd, d: route[0](sent, fd, d), keep_local=route[1])):
            assert console_lines(1, data) if isinstance(data, Lines) else console_write(1, data)
            assert writer().drain()  # the console's thread wrote it, along the route it was queued with
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(w)
    os.set_blocking(r, False)
    try:
        local = os.read(r, 1 << 16)
    except BlockingIOError:
        local = b""
    os.close(r)
    return local, sent


def _forward(sent, fd, data):
    sent.append((fd, data))
    return True


def _lost(sent, fd, data):
    return False


def test_unrouted_writes_locally_only():
    assert _pipe_write(None) == (b"line\n", [])


def test_unrouted_records_are_rendered_here():
    assert _pipe_write(None, RECORDS) == (RENDERED, [])


@pytest.mark.parametrize(("data", "forwarded"), [(b"line\n", raw(b"line\n")), (RECORDS, RECORDS)])
def test_under_a_head_and_on_node_0_records_go_over_the_channel_only(data, forwarded):
    assert _pipe_write((_forward, False), data) == (b"", [(1, forwarded)])


def test_other_pod_nodes_forward_and_keep_their_own_log_rendered():
    assert _pipe_write((_forward, True), RECORDS) == (RENDERED, [(1, RECORDS)])


@pytest.mark.parametrize(("data", "local"), [(b"line\n", b"line\n"), (RECORDS, RENDERED)])
def test_a_lost_channel_falls_back_to_the_local_console_rendered(data, local):
    assert _pipe_write((_lost, False), data) == (local, [])


def test_the_route_ends_with_its_block():
    with routed(Route(lambda fd, d: True, keep_local=False)):
        assert consoleroute._route is not None
    assert consoleroute._route is None
