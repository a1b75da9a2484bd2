"""A node's probe server: the one listening socket every peer's probe connects to (issue 24).

Each connection's first byte picks who serves it: ``E`` echo and ``S`` sink are the TCP probe's (``tcp_probe``),
``A`` starts this node's rank of a pair's all-reduce (``allreduce_pair``). Any other byte closes the connection.
"""

from __future__ import annotations

import socket
import threading

from xrun.launch.network import allreduce_pair, tcp_probe


class ProbeServer:
    """Accepts on every address of ``port`` (0: the kernel picks); one thread per connection, daemons all."""

    def __init__(self, port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("", port))
        self._sock.listen(128)
        self.port = int(self._sock.getsockname()[1])
        threading.Thread(target=self._accept, name="xrun-netprobe-accept", daemon=True).start()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept thread; close alone leaves it listening
        except OSError:
            pass
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=_serve, args=(conn,), name="xrun-netprobe-conn", daemon=True).start()


def _serve(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(30)  # a client that vanishes mid-probe must not hold a thread forever
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            mode = conn.recv(1)
            if mode == tcp_probe.ECHO:
                tcp_probe.echo(conn)
            elif mode == tcp_probe.SINK:
                tcp_probe.sink(conn)
            elif mode == allreduce_pair.ALLREDUCE:
                conn.settimeout(None)  # the all-reduce worker is bounded by its own timeout
                allreduce_pair.serve(conn)
        except OSError:
            return
