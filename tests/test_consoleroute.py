"""Where a node's console goes (xrun.launch.output.consoleroute): local fds, and in pod mode node 0's console too."""

import os

from xrun.launch.output import consoleroute
from xrun.launch.output.consoleroute import Route, routed
from xrun.launch.output.writer import console_write, writer


def _pipe_write(route, data=b"line\n"):
    """console_write to fd 1 under ``route``, with fd 1 on a pipe; what reached the pipe and what went along."""
    sent = []
    r, w = os.pipe()
    saved = os.dup(1)
    try:
        os.dup2(w, 1)
        with routed(None if route is None else Route(lambda fd, d: route[0](sent, fd, d), keep_local=route[1])):
            assert console_write(1, data)
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


def test_node_0_forwards_only():
    assert _pipe_write((_forward, False)) == (b"", [(1, b"line\n")])


def test_other_nodes_forward_and_keep_their_own_log():
    assert _pipe_write((_forward, True)) == (b"line\n", [(1, b"line\n")])


def test_a_lost_channel_falls_back_to_the_local_console():
    assert _pipe_write((_lost, False)) == (b"line\n", [])


def test_the_route_ends_with_its_block():
    with routed(Route(lambda fd, d: True, keep_local=False)):
        assert consoleroute._route is not None
    assert consoleroute._route is None
