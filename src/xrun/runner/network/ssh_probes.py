"""The probe processes of ``xrun check --network``: one ``python -m xrun.launch.network`` per node over ssh, and
the ``Prober`` that drives them (``LinkProber``).

Each runs for the whole check; the head writes JSON-line commands to its stdin (``probe_requests``) and reads one
answer line per command (the node side's doc has the protocol). Over paramiko or OpenSSH's client, as ``xrun
check`` chooses (``xrun.runner.ssh_connections.openssh_unless_paramiko``). A node whose probe does not come up
is data (``Down``), not an exception.
"""

from __future__ import annotations

import functools
import json
import queue
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from xrun.runner.network.coordinate import Request
from xrun.runner.network.node_verdicts import Probe
from xrun.runner.network.probe_requests import command_for, probe_budget, probe_from
from xrun.runner.remote_options import SshSettings, openssh_args
from xrun.runner.ssh_connections import Connected, connect_all, openssh_unless_paramiko
from xrun.shell import render

HELLO_TIMEOUT = 30.0  # ssh handshake + interpreter start on a loaded node
MAX_PARALLEL = 1024  # probing nodes driven at once: a wave of 1,000 nodes is 500 pairs, all at the same time


@dataclass(frozen=True)
class Down:
    host: str
    reason: str


class Writer(Protocol):
    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class Link:
    """One node's probe process: lines in, lines out, read by a thread so every wait has a deadline."""

    def __init__(self, host: str, stdin: Writer, stdout: Iterable[str], close: Callable[[], None],
                 stderr: Iterable[str] | None = None) -> None:
        self.host = host
        self.hello: dict[str, Any] = {}
        self._stdin = stdin
        self._close = close
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._last_error = ""
        threading.Thread(target=self._pump, args=(stdout,), daemon=True).start()
        if stderr is not None:
            threading.Thread(target=self._errors, args=(stderr,), daemon=True).start()

    def _pump(self, stdout: Iterable[str]) -> None:
        try:
            for line in stdout:
                self._lines.put(line)
        except (OSError, ValueError):
            pass
        self._lines.put(None)

    def _errors(self, stderr: Iterable[str]) -> None:
        try:
            for line in stderr:
                if line.strip():
                    self._last_error = line.strip()
        except (OSError, ValueError):
            pass

    def read(self, timeout: float) -> dict[str, Any] | str:
        """The next JSON object the process printed, or why there is none (a string)."""
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                return f"no answer from the probe on {self.host} within {timeout:g} s"
            if line is None:
                self._lines.put(None)
                return f"the probe on {self.host} ended: {self._last_error or 'no message'}"
            try:
                data = json.loads(line)
            except ValueError:
                continue  # a stray line (a warning): not ours
            if isinstance(data, dict):
                return data

    def send(self, command: dict[str, Any]) -> None:
        self._stdin.write(json.dumps(command) + "\n")
        self._stdin.flush()

    def close(self) -> None:
        try:
            self._stdin.close()
        except OSError:
            pass
        self._close()


def probe_command(python: str, toward: str) -> str:
    return render([python, "-m", "xrun.launch.network", "--toward", toward])


def start_links(hosts: Sequence[str], python: str, settings: SshSettings) -> list[Link | Down]:
    """One probe process per host, all at once; each reports toward ``hosts[0]`` (the job's master)."""
    command = probe_command(python, hosts[0])
    ssh = openssh_unless_paramiko()
    links = _paramiko_links(hosts, command, settings) if ssh is None else _openssh_links(ssh, hosts, command, settings)
    with ThreadPoolExecutor(max_workers=min(64, len(links))) as pool:
        return list(pool.map(_greet, links))


def _greet(link: Link | Down) -> Link | Down:
    if isinstance(link, Down):
        return link
    hello = link.read(HELLO_TIMEOUT)
    if isinstance(hello, str) or not hello.get("ready") or not hello.get("address"):
        link.close()
        return Down(link.host, hello if isinstance(hello, str) else f"the probe found no address: {hello}")
    link.hello = hello
    return link


def _openssh_links(ssh: str, hosts: Sequence[str], command: str, settings: SshSettings) -> list[Link | Down]:
    links: list[Link | Down] = []
    for host in hosts:
        proc = subprocess.Popen([ssh, *openssh_args(settings), "--", host, command], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        links.append(Link(host, proc.stdin, proc.stdout, functools.partial(_end, proc), proc.stderr))
    return links


def _end(proc: subprocess.Popen[str]) -> None:
    try:
        proc.wait(timeout=5)  # the probe exits at end of input; ssh follows
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _paramiko_links(hosts: Sequence[str], command: str, settings: SshSettings) -> list[Link | Down]:
    links: list[Link | Down] = []
    for result in connect_all(list(hosts), settings):
        if not isinstance(result, Connected):
            links.append(Down(result.host, result.reason))
            continue
        stdin, stdout, stderr = result.client.exec_command(command)
        links.append(Link(result.host, _Text(stdin), _lines(stdout), result.client.close, _lines(stderr)))
    return links


class _Text:
    """paramiko's channel files speak bytes: a text face for ``Link.send``."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def write(self, text: str) -> int:
        self._raw.write(text.encode())
        return len(text)

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        self._raw.channel.shutdown_write()


def _lines(raw: Any) -> Iterable[str]:
    for line in raw:
        yield line.decode("utf-8", "replace") if isinstance(line, bytes) else line


class LinkProber:
    """``Prober`` over the links: a node's requests in turn, different nodes at once."""

    def __init__(self, links: Mapping[int, Link]) -> None:
        self._links = dict(links)

    def run(self, requests: Sequence[Request]) -> list[Probe]:
        by_src: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            by_src.setdefault(request.src, []).append(i)
        results: dict[int, Probe] = {}

        def one_node(indices: list[int]) -> None:
            for i in indices:
                results[i] = self._one(requests[i])

        # one waiting thread per probing node: every pair of a wave runs at once (they only wait on a queue)
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(by_src) or 1)) as pool:
            list(pool.map(one_node, by_src.values()))
        return [results[i] for i in range(len(requests))]

    def _one(self, request: Request) -> Probe:
        src = self._links[request.src]
        src.send(command_for(request, src.hello, self._links[request.dst].hello))
        answer = src.read(probe_budget(request))
        if isinstance(answer, str):
            return Probe(request.src, request.dst, ok=False, error=answer)
        return probe_from(request, answer)
