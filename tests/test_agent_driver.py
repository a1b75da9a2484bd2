"""The agent's driver (xrun.launch.session.driver) for real: a ``python -m xrun.launch --connect`` process against a
scripted runner in this process that speaks the channel as the head does (TLS, the proofs, then the protocol), with
a real ``/bin/true`` or ``sleep`` rank. The machine's rules are tests/test_agent_machine.py's tables; here, that the
driver carries them out: two attempts with --precheck's probes between them, a spare taking a place, a stop that
reaches the ranks, an engine's exit code.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from tests.conftest import ROOT
from xrun import channel
from xrun.channel import Kind, Message, message
from xrun.channel.handshake import ServerHandshake
from xrun.channel.messages import lines_of
from xrun.channel.proof import HEAD_PURPOSE, token_key
from xrun.channel.tls_server import ServerIdentity
from xrun.common.rankplan import LaunchOptions
from xrun.common.spec import AgentOptions, PythonMode
from xrun.runner.plan import JobRequest, make_plan

TOKEN = "d" * 64
IDENTITY = ServerIdentity.mint()

Reply = Callable[[Message], list[Message]]


def node_spec(tmp_path, *args: str, script: str = "true") -> dict:
    request = JobRequest(script=script, args=args, cwd=str(tmp_path),
                         launch=LaunchOptions(mode=PythonMode.NONE, local_rank_arg=False))
    return make_plan(request, {"localhost": (0,)}, "ssh").nodes[0].to_json()


class Runner:
    """Accepts one agent and answers each of its messages with ``reply(msg)``; records what the agent said."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.heard: list[Message] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def kinds(self) -> list[str]:
        return [str(m["type"]) for m in self.heard if m["type"] not in ("auth", "pong")]

    def _serve(self) -> None:
        self.listener.settimeout(30)
        raw, _ = self.listener.accept()
        raw.settimeout(30)
        handshake = ServerHandshake(lambda node: token_key(TOKEN, HEAD_PURPOSE), IDENTITY.fingerprint,
                                    prove_server=False)
        reader = channel.FrameReader()
        with IDENTITY.server_context().wrap_socket(raw, server_side=True) as sock:
            try:
                while True:
                    msg = channel.recv(sock, reader, timeout=30)
                    self.heard.append(msg)
                    if msg["type"] == Kind.AUTH.value:
                        channel.send(sock, handshake.on_auth(msg))
                        continue
                    if msg["type"] == Kind.HELLO.value:
                        assert handshake.check_hello(msg)
                    for answer in self.reply(msg):
                        channel.send(sock, answer)
            except channel.ChannelError:
                pass  # the agent is gone
        self.listener.close()


def agent(runner: Runner, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-u", "-m", "xrun.launch", f"--connect=127.0.0.1:{runner.port}",
            f"--fingerprint={IDENTITY.fingerprint}", *(flags or ("--node_rank=0",)), "--token=-"]
    proc = subprocess.run(argv, input=f"{TOKEN}\n", capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
    runner.thread.join(10)
    return proc


def test_two_attempts_with_the_precheck_between_them(tmp_path):
    """spec -> ready -> start -> done -> restart -> ready -> probe_open/probe answered -> start (attempt 1) -> done
    -> verdict: the agent exits with its last attempt's code, its probe server closed."""
    spec = node_spec(tmp_path)
    seen: dict[str, int] = {}

    def reply(msg: Message) -> list[Message]:
        kind = msg["type"]
        seen[kind] = seen.get(kind, 0) + 1
        if kind == Kind.HELLO.value:
            return [message(Kind.SPEC, spec=spec, max_restarts=1, pick_master_port=False, master_port=0)]
        if kind == Kind.READY.value and seen[kind] == 1:
            return [message(Kind.START, master_addr="127.0.0.1", master_port=29500)]
        if kind == Kind.READY.value:
            return [message(Kind.PING), message(Kind.PROBE_OPEN, toward="127.0.0.1")]
        if kind == Kind.PROBE_READY.value:
            seen["port"] = msg["port"]
            return [message(Kind.PROBE, id=0, probe=f"127.0.0.1:{msg['port']}", mode="measure", seconds=0.05,
                            timeout=2.0)]
        if kind == Kind.PROBED.value:
            return [message(Kind.START, master_addr="127.0.0.1", master_port=29501, restart_count=1)]
        if kind == Kind.DONE.value and seen[kind] == 1:
            return [message(Kind.STOP, signal=15, deadline=5.0, reason="stale"), message(Kind.RESTART, attempt=1)]
        if kind == Kind.DONE.value:
            return [message(Kind.VERDICT, exit_code=0)]
        return []

    runner = Runner(reply)
    proc = agent(runner)
    assert proc.returncode == 0, proc.stderr
    assert runner.kinds() == ["hello", "ready", "started", "rank_exited", "done", "ready", "probe_ready", "probed",
                              "started", "rank_exited", "done"]
    probed = next(m for m in runner.heard if m["type"] == Kind.PROBED.value)
    assert probed["ok"] and probed["id"] == 0, probed
    assert [m["type"] for m in runner.heard].count("pong") == 1
    with pytest.raises(OSError):  # the probe server closed with the wait: nothing of the check outlives it
        socket.create_connection(("127.0.0.1", seen["port"]), timeout=2).close()


def test_a_spare_stands_by_then_runs_a_lost_nodes_place(tmp_path):
    spec = node_spec(tmp_path)

    def reply(msg: Message) -> list[Message]:
        kind = msg["type"]
        if kind == Kind.HELLO.value:
            return [message(Kind.SPEC, spec=spec, standby=True, max_restarts=2)]
        if kind == Kind.READY.value and msg.get("master_port") is None and not reply.taken:  # type: ignore[attr-defined]
            reply.taken = True  # type: ignore[attr-defined]
            return [message(Kind.PING), message(Kind.SPEC, spec=spec, max_restarts=2, pick_master_port=True,
                                                master_port=0)]
        if kind == Kind.READY.value:
            assert isinstance(msg["master_port"], int) and msg["master_port"] > 0  # it settles rank 0's port now
            return [message(Kind.START, master_addr="127.0.0.1", master_port=msg["master_port"], restart_count=2)]
        if kind == Kind.DONE.value:
            return [message(Kind.VERDICT, exit_code=0)]
        return []

    reply.taken = False  # type: ignore[attr-defined]
    runner = Runner(reply)
    proc = agent(runner)
    assert proc.returncode == 0, proc.stderr
    assert runner.kinds() == ["hello", "ready", "ready", "started", "rank_exited", "done"]


def test_a_stop_reaches_the_running_ranks_and_an_engine_gets_0_once_the_runner_has_the_code(tmp_path):
    spec = node_spec(tmp_path, "60", script="sleep")

    def reply(msg: Message) -> list[Message]:
        if msg["type"] == Kind.HELLO.value:
            return [message(Kind.SPEC, spec=spec)]
        if msg["type"] == Kind.READY.value:
            return [message(Kind.START, master_addr="127.0.0.1", master_port=29500)]
        if msg["type"] == Kind.STARTED.value:
            return [message(Kind.STOP, signal=15, deadline=5.0, reason="another node failed")]
        return []

    runner = Runner(reply)
    proc = agent(runner, "--node_rank_from=OMPI_COMM_WORLD_RANK", env={"OMPI_COMM_WORLD_RANK": "0"})
    assert proc.returncode == 0, proc.stderr  # the engine is told 0: the runner has the node's 143
    done = next(m for m in runner.heard if m["type"] == Kind.DONE.value)
    exited = next(m for m in runner.heard if m["type"] == Kind.RANK_EXITED.value)
    assert done["exit_code"] == 143 and exited["stopped"] and exited["signal"] == 15, (done, exited)


def test_a_runner_that_vanishes_at_the_barrier_is_one_line(tmp_path):
    spec = node_spec(tmp_path)

    def reply(msg: Message) -> list[Message]:
        if msg["type"] == Kind.HELLO.value:
            return [message(Kind.SPEC, spec=spec)]
        raise channel.ChannelError("the runner goes away")  # closes the connection after ready

    proc = agent(Runner(reply))
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0] == f"xrun.launch[{socket.gethostname()}]: connection closed by the peer", lines


# -- --preload: the helper is the agent's for its whole life (issue 32) -----------------------------------------

RANK = os.path.join(ROOT, "tests", "procs", "preload_rank.py")


def preload_spec(tmp_path, modules: tuple[str, ...], *args: str) -> dict:
    request = JobRequest(script=RANK, args=args, cwd=str(tmp_path), launch=LaunchOptions(python=sys.executable),
                         options=AgentOptions(preload=modules))
    return make_plan(request, {"localhost": (0, 1)}, "ssh").nodes[0].to_json()


def test_the_preflight_waits_for_the_helper_answering_pings_and_every_attempt_forks_from_it(tmp_path):
    """The spec starts the helper; a ping during its (slow) import is answered; ready once it is in; both attempts'
    ranks are forked from it (the same pid and import time in preload_mark)."""
    spec = preload_spec(tmp_path, ("preload_mark",))
    seen: dict[str, int] = {}

    def reply(msg: Message) -> list[Message]:
        kind = msg["type"]
        seen[kind] = seen.get(kind, 0) + 1
        if kind == Kind.HELLO.value:
            return [message(Kind.SPEC, spec=spec, max_restarts=1, pick_master_port=False, master_port=0),
                    message(Kind.PING)]
        if kind == Kind.READY.value:
            return [message(Kind.START, master_addr="127.0.0.1", master_port=29500, restart_count=seen[kind] - 1)]
        if kind == Kind.DONE.value and seen[kind] == 1:
            return [message(Kind.RESTART, attempt=1)]
        if kind == Kind.DONE.value:
            return [message(Kind.VERDICT, exit_code=0)]
        return []

    runner = Runner(reply)
    proc = agent(runner, env={"PRELOAD_MARK_SLEEP": "1.5"})
    assert proc.returncode == 0, proc.stderr
    said = [str(m["type"]) for m in runner.heard if m["type"] != "auth"]
    assert said.index("pong") < said.index("ready"), said  # answered while the helper imported
    assert said.count("ready") == 2 and said.count("done") == 2
    helper = int(proc.stderr.split("the ranks are forked from the helper (pid ", 1)[1].split(")")[0])
    # the ranks' lines come over the channel as line records: (ranks, text) each
    records = [text for m in runner.heard if m["type"] == Kind.LINES.value for _, text in lines_of(m)[2]]
    got = [json.loads(text) for text in records if text.startswith(b'{"rank"')]
    assert sorted((r["attempt"], r["rank"]) for r in got) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r["mark_pid"] for r in got} == {helper} and len({r["mark_t"] for r in got}) == 1
    assert proc.stderr.count("preloaded preload_mark in") == 1


def test_a_module_the_helper_cannot_import_fails_the_preflight_as_bad_input(tmp_path):
    spec = preload_spec(tmp_path, ("preload_raises",))

    def reply(msg: Message) -> list[Message]:
        return [message(Kind.SPEC, spec=spec)] if msg["type"] == Kind.HELLO.value else []

    runner = Runner(reply)
    proc = agent(runner)
    assert proc.returncode == 2, proc.stderr
    error = next(m for m in runner.heard if m["type"] == Kind.ERROR.value)
    assert error["exit_code"] == 2 and error["message"].startswith(
        "--preload: cannot import 'preload_raises' (RuntimeError: refusing to load here)"), error
    assert "ready" not in runner.kinds()


def test_a_helper_killed_during_an_attempt_fails_the_next_preflight_naming_it(tmp_path):
    spec = preload_spec(tmp_path, ("preload_mark",), "kill_helper=1")
    seen: dict[str, int] = {}

    def reply(msg: Message) -> list[Message]:
        kind = msg["type"]
        seen[kind] = seen.get(kind, 0) + 1
        if kind == Kind.HELLO.value:
            return [message(Kind.SPEC, spec=spec, max_restarts=1, pick_master_port=False, master_port=0)]
        if kind == Kind.READY.value:
            return [message(Kind.START, master_addr="127.0.0.1", master_port=29500)]
        if kind == Kind.DONE.value:
            return [message(Kind.RESTART, attempt=1)]  # as if another node had failed
        return []

    runner = Runner(reply)
    proc = agent(runner)
    assert proc.returncode == 1, proc.stderr
    assert runner.kinds()[-2:] == ["done", "error"]
    error = next(m for m in runner.heard if m["type"] == Kind.ERROR.value)
    assert error["exit_code"] == 1, error  # a node's failure, not bad input (2): the runner names the host
    assert re.fullmatch(r"--preload: the helper \(pid \d+\) was killed by SIGKILL during the last attempt, so the "
                        r"next attempt's ranks cannot be forked on this node: .*", error["message"]), error
