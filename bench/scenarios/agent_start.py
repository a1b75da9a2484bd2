"""Scale scenario ``agent_start``: the node agent at interpreter speed. The CPU of one node agent's whole life,
``python -m xrun.launch --connect`` with one ``/bin/true`` rank (import, hello, spec, preflight, ready, start,
the rank's supervision, done, exit), against ``python -c pass``: what any Python process costs here.

The runner is a stub in this process speaking the channel protocol (``xrun.channel``) as the head does: TLS 1.3
with a certificate minted once per bench run (its fingerprint on the agent's ``--fingerprint``, the token on the
agent's stdin, as the ssh backend gives them), ``auth`` -> ``challenge``, then the agent's hello is checked for
its proof, so the agent's figure includes the channel's whole cost (``import ssl``, the TLS handshake, the
proofs). It then sends a one-rank node spec (planned by xrun's own planner, the rank's argv replaced by
``/bin/true`` so that no second interpreter is counted), answers ``ready`` with ``start`` and reads until
``done``. CPU is user + system time from ``wait4``: the agent's own plus its reaped children's (the forked
watchdog and ``/bin/true``, ~1 ms), so other work on the machine slows the wall clock more than this figure.
``ready_s`` is exec to ``ready`` (the start barrier), ``wall_s`` exec to exit.

Every Python process on these machines pays for ``site`` and the ``.pth`` files installed here (an editable
install's finder, a sandbox CA hook importing certifi: ~20 ms of CPU that no wheel install of xrun has), so each
pair also runs with ``-S`` (no ``site``; xrun found through ``PYTHONPATH``): ``agent -S`` against
``python -S -c pass`` shows xrun's own cost (a column, not a target: ``json`` and ``socket`` alone exceed 2× a
bare ``-S`` interpreter). The target, issue 15's, is on the plain pair. The import profile of the same path
(``-X importtime``) is part of ``python -m bench.profile``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

from bench import harness
from bench.scenarios.base import Context, finish, median, section, target

NAME = "agent_start"
TITLE = "Scale A. Node agent: its whole life with one /bin/true rank, CPU ×python -c pass"
VARIANTS = ("python -c pass", "agent", "python -S -c pass", "agent -S")
REFERENCES = ("python -c pass", "python -S -c pass")
TABLE = {
    "metrics": [["cpu_ms", "CPU (user+sys)", "ms"], ["ready_s", "exec→ready", "s"], ["wall_s", "exec→exit", "s"]],
    "ratio": "cpu_ms",
    "reference": "python -c pass",
    "references": list(REFERENCES),
}
TOKEN = "b" * 64


def run(ctx: Context) -> dict[str, Any]:
    rounds = ctx.rounds(3, 15)
    sec = section(NAME, TITLE, params={"rounds": rounds}, skipped={}, table=TABLE, groups=[], targets=[])
    env = harness.bench_env("xbench-agent")
    spec = _one_rank_spec()
    from xrun.channel.tls_server import ServerIdentity

    identity = ServerIdentity.mint()

    def trial(variant: str) -> harness.Trial:
        flags = ["-S"] if variant.endswith("-S") or " -S " in variant else []
        if variant.startswith("agent"):
            return agent_trial(env, spec, flags, identity)
        return python_trial(env, flags)

    results = harness.run_rounds(list(VARIANTS), rounds, trial, rng=ctx.rng, label=NAME)
    group = {"label": "1 rank", "params": {}, **harness.summarize_group(results, references=REFERENCES)}
    sec["groups"].append(group)
    ratio = median(group, "agent", "cpu_ms", "python -c pass")
    sec["targets"].append(target("agent import + start CPU / python -c pass", ratio, 2.0, "×"))
    return finish(sec)


def _one_rank_spec() -> dict[str, Any]:
    """This machine's node spec for one ``/bin/true`` rank, as the head would send it (pdsh: a channel backend)."""
    from xrun.common.rankplan import LaunchOptions
    from xrun.common.spec import PythonMode
    from xrun.runner.plan import JobRequest, make_plan

    request = JobRequest(script="true", launch=LaunchOptions(mode=PythonMode.NONE, local_rank_arg=False),
                         cwd=os.getcwd())
    return make_plan(request, {"localhost": (0,)}, "pdsh").nodes[0].to_json()


def _cpu_ms(rusage: Any) -> float:
    return (rusage.ru_utime + rusage.ru_stime) * 1000


def _with_xrun_path(env: dict[str, str]) -> dict[str, str]:
    """``-S`` skips the install's .pth files: find xrun (the one this bench imports) through PYTHONPATH."""
    import xrun

    root = os.path.dirname(os.path.dirname(os.path.abspath(xrun.__file__)))
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)}


def python_trial(env: dict[str, str], flags: list[str]) -> harness.Trial:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, *flags, "-c", "pass"], env=env, stdin=subprocess.DEVNULL)
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return harness.Trial(metrics={"cpu_ms": _cpu_ms(rusage), "wall_s": time.monotonic() - t0},
                         exit_code=proc.returncode)


def agent_trial(env: dict[str, str], spec: dict[str, Any], flags: list[str], identity: Any) -> harness.Trial:
    """One agent's life against the stub runner: TLS, auth -> challenge -> hello -> spec -> ready -> start -> ...
    -> done -> exit."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        argv = [sys.executable, *flags, "-u", "-m", "xrun.launch", f"--connect=127.0.0.1:{port}", "--node_rank=0",
                f"--fingerprint={identity.fingerprint}", "--token=-"]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, env=_with_xrun_path(env), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        assert proc.stdin is not None
        proc.stdin.write(f"{TOKEN}\n".encode())  # as the ssh backend hands it over
        proc.stdin.close()
        listener.settimeout(30)
        try:
            sock, _ = listener.accept()
            with sock:
                ready_s, error = _serve_one(sock, spec, t0, identity)
        except OSError as err:
            ready_s, error = None, f"no agent: {err}"
        _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    metrics = {"cpu_ms": _cpu_ms(rusage), "ready_s": ready_s, "wall_s": time.monotonic() - t0}
    return harness.Trial(metrics=metrics, exit_code=proc.returncode, error=error)


def _serve_one(raw: socket.socket, spec: dict[str, Any], t0: float,
               identity: Any) -> tuple[float | None, str | None]:
    """The runner's side of one node's life; (seconds to ready, what went wrong)."""
    from xrun import channel
    from xrun.channel import Kind, message
    from xrun.channel.handshake import ServerHandshake
    from xrun.channel.proof import HEAD_PURPOSE, token_key

    key = token_key(TOKEN, HEAD_PURPOSE)
    handshake = ServerHandshake(lambda node: key, identity.fingerprint, prove_server=False)
    reader = channel.FrameReader()
    seen: list[str] = []
    ready_s = None
    try:
        raw.settimeout(30)
        sock = identity.server_context().wrap_socket(raw, server_side=True)
    except OSError as err:
        return None, f"TLS handshake failed: {err}"
    try:
        while Kind.DONE.value not in seen:
            msg = channel.recv(sock, reader, timeout=30)
            seen.append(str(msg.get("type")))
            if msg["type"] == Kind.AUTH.value:
                reply = handshake.on_auth(msg)
                if isinstance(reply, channel.ChannelError):
                    return None, f"auth refused: {reply.reason}"
                channel.send(sock, reply)
            elif msg["type"] == Kind.HELLO.value:
                if not handshake.check_hello(msg):
                    return None, "the agent's hello did not prove the token's key"
                channel.send(sock, message(Kind.SPEC, spec=spec, pick_master_port=False))
            elif msg["type"] == Kind.READY.value:
                ready_s = time.monotonic() - t0
                channel.send(sock, message(Kind.START, master_addr="127.0.0.1", master_port=29500))
    except channel.ChannelError as err:
        return ready_s, f"{err.reason} after {seen}"
    return ready_s, None
