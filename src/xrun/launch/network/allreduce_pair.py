"""``--network=allreduce``: a 2-process torch.distributed group per pair, timed (issue 24); both of its sides.

The probing node (``src``, ``run_pair``) connects to its partner's probe server with mode byte ``A`` and one JSON
line (the group's rendezvous: ``src``'s address on that connection and a free port, the backend, the tensor size);
the partner's server hands the connection to ``serve``. Both sides then start one
``python -m xrun.launch.network.allreduce_worker`` (rank 0 here, rank 1 there), which imports torch, forms the
group within ``timeout`` and times ``iters`` all-reduces. Torch is imported only in those workers: this module,
the probe process and the launch path never import it. The head's choices for a pair (its backend, its size) are
``probe_terms``'.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from xrun.common.network.interfaces import holder, read_addresses
from xrun.common.network.probe_terms import BYTES, CONNECT_TIMEOUT, GROUP_TIMEOUT
from xrun.launch.network.tcp_probe import describe
from xrun.net import free_port

ALLREDUCE = b"A"  # the mode byte of a connection to a probe server (``probe_server``)
ITERS = 5


@dataclass(frozen=True)
class Result:
    """One pair's all-reduce: algorithm bandwidth (MB/s: the tensor's bytes / the median time), or why none."""

    ok: bool
    allreduce_mbs: float | None = None
    error: str = ""


def gpu_count() -> int:
    """NVIDIA GPUs the driver lists, without importing torch (0 where there is no driver)."""
    listed = glob.glob("/proc/driver/nvidia/gpus/*")
    return len(listed) if listed else len(glob.glob("/dev/nvidia[0-9]*"))


def has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def _interface_of(address: str) -> str | None:
    return holder(address, read_addresses()) or holder(address, read_addresses(wide=True))


def _worker(rank: int, spec: dict[str, Any], local: str) -> subprocess.Popen[str]:
    """Start one rank; gloo binds the interface that holds ``local`` (not what the host name resolves to)."""
    env = dict(os.environ)
    interface = _interface_of(local)
    if interface:
        env["GLOO_SOCKET_IFNAME"] = interface
        env["NCCL_SOCKET_IFNAME"] = interface
    argv = [sys.executable, "-m", "xrun.launch.network.allreduce_worker", "--rank", str(rank),
            "--spec", json.dumps(spec)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen[str], timeout: float) -> Result:
    """The worker's one JSON line, or why there is none (killed past ``timeout``)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Result(ok=False, error=f"the all-reduce did not finish within {timeout:g} s")
    for line in reversed(out.splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            rate = data.get("allreduce_mbs")
            return Result(bool(data.get("ok")), float(rate) if isinstance(rate, (int, float)) else None,
                          str(data.get("error") or ""))
    last = err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
    return Result(ok=False, error=f"the all-reduce worker failed: {last}")


def run_pair(address: str, port: int, *, backend: str = "gloo", size: int = BYTES, iters: int = ITERS,
             timeout: float = GROUP_TIMEOUT, connect_timeout: float = CONNECT_TIMEOUT) -> Result:
    """Rank 0 of a pair with the probe server at ``address:port`` (which starts rank 1)."""
    try:
        sock = socket.create_connection((address, port), timeout=connect_timeout)
    except OSError as err:
        return Result(ok=False, error=describe(err, address, port))
    with sock:
        local = str(sock.getsockname()[0])
        spec = {"master": local, "port": free_port(local), "backend": backend, "bytes": size, "iters": iters,
                "timeout": timeout}
        sock.sendall(ALLREDUCE + json.dumps(spec).encode() + b"\n")
        mine = _finish(_worker(0, spec, local), timeout * 2)
        sock.settimeout(timeout * 2)
        theirs = _read_result(sock)
    if mine.ok or theirs is None or theirs.ok:
        return mine
    return Result(ok=False, error=f"{mine.error}; the partner's rank: {theirs.error}")


def _read_result(sock: socket.socket) -> Result | None:
    try:
        line = sock.makefile("r").readline()
        data = json.loads(line)
    except (OSError, ValueError):
        return None
    return Result(bool(data.get("ok")), data.get("allreduce_mbs"), str(data.get("error") or ""))


def serve(conn: socket.socket) -> None:
    """The probe server's side of mode ``A`` (the mode byte already read): start rank 1, answer its result."""
    line = conn.makefile("r").readline()
    try:
        spec = json.loads(line)
        timeout = float(spec["timeout"])
    except (ValueError, KeyError, TypeError):
        conn.sendall(json.dumps({"ok": False, "error": f"bad all-reduce request {line.strip()[:80]!r}"}).encode())
        return
    result = _finish(_worker(1, spec, str(conn.getsockname()[0])), timeout * 2)
    conn.sendall(json.dumps({"ok": result.ok, "allreduce_mbs": result.allreduce_mbs,
                             "error": result.error}).encode() + b"\n")
