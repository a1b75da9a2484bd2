"""``python -u -m xrun.launch --connect=HEAD:PORT --fingerprint=SHA256 --node_rank=K --token=-``: the agent of a
multi-node run.

The backend (ssh, pdsh, ...) starts this tiny command on every node (rendered by
``xrun.launch.command.connect_argv``; ``build_parser`` below reads it). The agent connects back to the runner's
control server over TLS, checks the server's certificate against the pinned fingerprint, proves it holds the
run's key without sending it (xrun.channel.link), and receives its node spec (ranks,
argv, environment, working directory) over the channel, so neither the user's arguments nor any environment
value ever appear on a command line. Then:

    hello -> spec -> ready -> (barrier) start -> run_node(spec, hooks=ChannelHooks) -> rank_exited... -> done

``ChannelHooks`` is the ``AgentHooks`` of ``xrun.launch.agent``: a reader thread owns the socket (it answers
pings even while the event loop is busy and notices a silent runner after ``DEAD_AFTER`` s) and wakes the
rank group's event loop through a pipe; ``stop`` and connection loss both become ``group.request_stop``
(a ``stop`` with ``stacks`` after the survivors' stacks are taken for the report). It is also the hang doctor's
link (xrun.launch.doctor.node_doctor): ``dump`` is answered with ``stacks``, and SIGQUIT, silence and speech go to
the head as ``want_stacks``, ``quiet`` and ``spoke``.
Losing the runner (``kill -9``, network cut) therefore tears this node's ranks down. Any other message
(pod mode's ``verdict``) waits in an inbox for ``next_message``; a lost channel puts None there.

The key it proves (never on a command line, which every user of the node can read): ``--token=-`` reads the
run token from the first line of stdin (the ssh backend sends it there); ``--token=env:NAME`` from the variable
NAME, removed from the environment at once (MPI and Slurm export it by name: ``mpirun -x``, hydra
``-genvlist``, ``srun --export``), so no rank inherits it; ``--token=announce`` makes a one-time key and
announces it on stderr, which pdsh carries to the head over its ssh session (xrun.channel.announce).

The node rank: ``--node_rank=K``, or ``--node_rank_from=VAR[,VAR...]`` where the engine numbers its processes
itself (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``SLURM_PROCID``): the first of those variables that is set.
Such an agent, started by an engine, exits 0 to it once its ``done`` reached the runner (``engine_exit_code``):
the job's code travels on the channel, and a non-zero exit would only set off the engine's slow abort.
"""

from __future__ import annotations

import collections
import functools
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, TypeVar

from xrun import __version__, channel
from xrun.channel import STOP_STACKS, ChannelError, Kind, message
from xrun.channel.announce import announce_line
from xrun.channel.link import Credentials, Link, open_link
from xrun.errors import UsageError, XrunError
from xrun.fdlimit import raise_open_files_limit
from xrun.launch.doctor.node_doctor import NodeDoctor
from xrun.launch.engine_env import drop_engine_identity, restore_home
from xrun.launch.network.answers import ProbeAnswers
from xrun.launch.preflight import check_spec, refusal
from xrun.launch.result.errorfile import error_lines
from xrun.launch.result.summary import RankFigures
from xrun.launch.spec import SPEC_VERSION, NodeSpec, RankSpec
from xrun.launch.tokens import TOKEN_ANNOUNCE, TOKEN_ENV_PREFIX, TOKEN_ON_STDIN
from xrun.net import master_port
from xrun.values import MAX_HOSTS, int_arg, one_line

if TYPE_CHECKING:
    import argparse

    from xrun.launch.result.stacks import RankStack

T = TypeVar("T")  # what ``serve_until`` returns: the message that ends the wait, or an exit code

CONNECT_TIMEOUT = 15.0  # the runner listens before any agent starts: this covers only a slow network
# A server at its bound of unproven connections closes new ones at once: try again (xrun.runner.job.gate).
RETRYABLE = ("the server closed the connection during the TLS handshake", "TLS handshake with the server failed")
SPEC_TIMEOUT = 30.0
EXIT_NO_RUNNER = 1


class ConnectArgs(NamedTuple):
    """The connect-mode command line, read (a NamedTuple: on every node's start path, issue 25 §4)."""

    connect: str
    node_rank: int | None
    node_rank_from: str | None
    fingerprint: str | None
    token: str

    def node_index(self, environ: Mapping[str, str]) -> int:
        """This node's index: --node_rank's, or the engine's variable --node_rank_from names."""
        if self.node_rank_from is not None:
            return node_rank_from(self.node_rank_from, environ)
        if self.node_rank is None:  # both readings require one of the two flags: never reached from main
            raise UsageError("--node_rank", "missing: give --node_rank or --node_rank_from")
        return self.node_rank


# Each flag as connect_argv renders it, and its field; argparse's own spellings are the same.
RENDERED_FLAGS = {"--connect": "connect", "--node_rank": "node_rank", "--node-rank": "node_rank",
                  "--node_rank_from": "node_rank_from", "--node-rank-from": "node_rank_from",
                  "--fingerprint": "fingerprint", "--token": "token"}


def parse_connect_args(argv: Sequence[str]) -> ConnectArgs:
    """The agent's command line: the rendered form read directly, anything else by argparse (which also says
    what is wrong with it, and answers --help)."""
    rendered = read_rendered(argv)
    if rendered is not None:
        return rendered
    ns = build_parser().parse_args(list(argv))
    return ConnectArgs(ns.connect, ns.node_rank, ns.node_rank_from, ns.fingerprint, ns.token)


def read_rendered(argv: Sequence[str]) -> ConnectArgs | None:
    """``connect_argv``'s own form (every flag ``--name=value``, each once, exactly one of the node rank's two
    flags, a node rank in range) read without argparse, whose import and parser cost about 4 ms of CPU on every
    node of every job; None for any other form. Both readings agree wherever this one answers (tests/test_cli.py)."""
    found: dict[str, str] = {}
    for arg in argv:
        name, sep, value = arg.partition("=")
        field = RENDERED_FLAGS.get(name)
        if not sep or field is None or field in found:
            return None
        found[field] = value
    if "connect" not in found or ("node_rank" in found) == ("node_rank_from" in found):
        return None
    rank = found.get("node_rank")
    if rank is not None and not (rank.isascii() and rank.isdigit() and int(rank) <= MAX_HOSTS):
        return None
    return ConnectArgs(connect=found["connect"], node_rank=None if rank is None else int(rank),
                       node_rank_from=found.get("node_rank_from"), fingerprint=found.get("fingerprint"),
                       token=found.get("token", TOKEN_ON_STDIN))


def build_parser() -> argparse.ArgumentParser:
    import argparse  # noqa: PLC0415 - only for a command line that is not connect_argv's form, and --help

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError("xrun.launch --connect", message)

    parser = Parser(prog="python -m xrun.launch --connect", add_help=True, allow_abbrev=False)
    parser.add_argument("--connect", required=True, metavar="HOST:PORT", help="the runner's control server")
    rank = parser.add_mutually_exclusive_group(required=True)
    rank.add_argument("--node_rank", "--node-rank", type=int_arg(high=MAX_HOSTS), help="this node's index")
    rank.add_argument("--node_rank_from", "--node-rank-from", metavar="VAR[,VAR...]",
                      help="read this node's index from the first of these variables that is set (MPI, Slurm)")
    parser.add_argument("--fingerprint", default=None, metavar="SHA256",
                        help="the SHA-256 of the runner's TLS certificate: any other server is refused")
    parser.add_argument("--token", default=TOKEN_ON_STDIN,
                        help="where the run's key comes from: '-' stdin's first line, 'env:NAME' variable NAME, "
                             "'announce' a one-time key announced on stderr (pdsh)")
    return parser


def split_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6ADDR]:PORT``."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError("--connect", f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def node_rank_from(names: str, environ: Mapping[str, str]) -> int:
    """The node rank an engine gave this process: the first of ``names`` (comma-separated) that is set."""
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    for name in wanted:
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit():
                raise UsageError("--node_rank_from", f"{name}={value!r} is not a node index")
            return int(value)
    raise UsageError("--node_rank_from", f"none of {', '.join(wanted)} is set: was this agent started by the engine?")


def read_credentials(value: str, fingerprint: str | None, node_rank: int) -> Credentials:
    """The key this agent proves and the certificate it pins (``--token``, ``--fingerprint``)."""
    from xrun.channel.proof import HEAD_PURPOSE, token_key  # noqa: PLC0415 - only a connecting agent

    if fingerprint is None or len(fingerprint) != 64:
        raise UsageError("--fingerprint", "expected the SHA-256 (64 hex digits) of the runner's certificate")
    if value == TOKEN_ANNOUNCE:
        key_hex = os.urandom(32).hex()  # what secrets.token_hex(32) is, without secrets' imports (hmac, random)
        os.write(2, announce_line(node_rank, key_hex))  # the head reads it on the engine's stream, before the hello
        return Credentials(token_key(key_hex, HEAD_PURPOSE), fingerprint.lower())
    return Credentials(token_key(read_token(value), HEAD_PURPOSE), fingerprint.lower())


def read_token(value: str) -> str:
    if value.startswith(TOKEN_ENV_PREFIX):
        name = value[len(TOKEN_ENV_PREFIX) :]
        token = os.environ.pop(name, "")  # gone before any rank starts: no rank inherits it
        if not token:
            raise UsageError("--token", f"{name} is not set; the launcher exports it to every node by name")
        return token
    if value != TOKEN_ON_STDIN:
        raise UsageError("--token", "takes '-', 'env:NAME' or 'announce': a token on the command line is every "
                         "local user's to read")
    line = sys.stdin.buffer.readline()
    if not line.endswith(b"\n"):
        raise UsageError("--token", "expected the run token on stdin (the runner sends it); got none")
    return line.strip().decode("ascii", "replace")


def open_channel(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    """Connect, retrying briefly on refusal (a listener that is still coming up) until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((_resolvable(host), port),  # type: ignore[arg-type] # bytes: getaddrinfo
                                            timeout=max(0.1, deadline - time.monotonic()))
        except OSError as err:
            if time.monotonic() >= deadline or not isinstance(err, ConnectionRefusedError):
                raise ChannelError(f"cannot reach the runner at {host}:{port}: {err.strerror or err}") from None
            time.sleep(0.2)
            continue
        sock.settimeout(None)
        channel.tune_socket(sock)
        return sock


def _resolvable(host: str) -> str | bytes:
    """An ASCII host name as bytes: ``getaddrinfo`` then takes it as it is instead of loading the ``idna`` codec
    (about 1 ms of every node's start), and a malformed name is a resolver error (an ``OSError``), not a
    ``UnicodeError``."""
    return host.encode("ascii") if host.isascii() else host


def secure_link(host: str, port: int, node_rank: int, credentials: Credentials,
                timeout: float = CONNECT_TIMEOUT) -> Link:
    """Connect, TLS, the server pinned, the key proven, the hello sent. A server that closes the connection
    before the handshake is through (at its bound of unproven connections, say) is tried again until
    ``timeout``; a server that is not the pinned one, or does not prove the key, is refused at once."""
    deadline = time.monotonic() + timeout
    while True:
        sock = open_channel(host, port, max(0.1, deadline - time.monotonic()))
        try:
            return open_link(sock, credentials, node_rank, functools.partial(hello, sock=sock),
                             timeout=max(1.0, deadline - time.monotonic()))
        except ChannelError as err:
            sock.close()
            if not err.reason.startswith(RETRYABLE) or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def hello(proof_fields: Mapping[str, Any], sock: socket.socket) -> dict[str, Any]:
    """The hello, with this connection's proof (``proof``, ``node_rank``: xrun.channel.handshake)."""
    return message(
        Kind.HELLO,
        **proof_fields,
        host=socket.gethostname(),
        pid=os.getpid(),
        addr=sock.getsockname()[0],  # this node's address on the route to the head: what peers can use
        versions={"xrun": __version__, "spec": SPEC_VERSION, "python": sys.version.split()[0],
                  "executable": sys.executable},
    )


def with_rendezvous(spec: NodeSpec, master_addr: str, master_port: int, restart_count: int = 0) -> NodeSpec:
    """Fill in what was decided at the barrier (the runner's plan carries placeholders for both) and, with
    --max_restarts, the attempt (torch's contract: ``TORCHELASTIC_RESTART_COUNT``)."""
    ranks = tuple(
        RankSpec(rank=r.rank, local_rank=r.local_rank, argv=r.argv,
                 env={**r.env, "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
                      "TORCHELASTIC_RESTART_COUNT": str(restart_count)})
        for r in spec.ranks
    )
    return replace(spec, ranks=ranks)


class ChannelHooks:
    """AgentHooks over the control channel (see the module doc)."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._send_lock = threading.Lock()
        self._outbox: collections.deque[dict[str, Any]] = collections.deque()  # to send, in order
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._group: Any = None
        self._doctor: NodeDoctor | None = None
        self._connected = True
        self._closing = False
        self._thread: threading.Thread | None = None
        self._inbox: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self.lost_reason: str | None = None  # why the channel was lost, once it was
        self._between = False  # --max_restarts: no rank group (between attempts): stop goes to the inbox
        self.result_delivered = False  # the node's done went out: the runner has its exit code
        self.heard = False  # a message came from the runner (pod mode: else a closed channel is a turn-away)

    def listen(self) -> None:
        """Pod mode: read from now on, before any rank group: until a start, every message but a ping goes to
        the inbox (``next_message``), as between two attempts."""
        self._between = True
        self._start_reader()

    def post_local(self, msg: dict[str, Any]) -> None:
        """Wake ``next_message`` with ``msg`` from this process (a signal's translation). Safe in a signal handler:
        ``SimpleQueue.put`` is reentrant."""
        self._inbox.put(msg)

    def _start_reader(self) -> None:
        if self._thread is None:  # once: a later attempt (--max_restarts) keeps the reader of the first
            self._thread = threading.Thread(target=self._read_forever, name="xrun-channel", daemon=True)
            self._thread.start()

    # -- AgentHooks -----------------------------------------------------------------------------------------

    def attach(self, group: Any, doctor: NodeDoctor | None = None) -> None:
        self._group = group
        self._doctor = doctor
        if doctor is not None:
            doctor.link = self  # SIGQUIT, silence and speech go to the head, which sees every node
        group.add_reader(self._wake_r, self._on_wake)
        self._start_reader()
        self.send(message(Kind.STARTED))

    def detach(self) -> None:
        """--max_restarts: the attempt's rank group is over. What it had not handled is stale (a stop sent to
        every node after this one's failure); until the next start, stop and the rest go to the inbox."""
        self._between = True
        while True:
            try:
                self._events.get_nowait()
            except queue.Empty:
                return

    def on_rank_exit(self, outcome: Any) -> None:
        self.send(message(
            Kind.RANK_EXITED,
            rank=outcome.rank,
            local_rank=outcome.local_rank,
            code=outcome.returncode,
            signal=outcome.signal,
            stopped=outcome.stopped_by_xrun,
            runtime_s=round(outcome.runtime_s, 3),
            # the recorded exception last: the head shows the end of the tail
            tail=list(outcome.stderr_tail) + (error_lines(outcome.rank, outcome.error) if outcome.error else []),
            figures=RankFigures.of(outcome).to_json(),  # the head's summary of the whole job
        ))

    def on_result(self, result: Any) -> None:
        if result.stacks:  # taken before the stop: the head merges every node's into its failure report
            self.send(message(Kind.STACKS, id=STOP_STACKS, stacks=[s.to_json() for s in result.stacks], problem=None))
        self.send(message(
            Kind.DONE,
            exit_code=result.exit_code,
            root_cause=result.root_cause.rank if result.root_cause is not None else None,
            interrupted_by=result.interrupted_by,
        ))
        self._send_waiting(wait=channel.DEAD_AFTER)  # the job's code: worth waiting for a forward in flight
        self.result_delivered = self._connected and not self._outbox

    # -- the doctor's link (xrun.launch.doctor.node_doctor.DoctorLink) -------------------------------------------

    def stacks_wanted(self, reason: str) -> None:
        self.send(message(Kind.WANT_STACKS, reason=reason))

    def quiet(self, silent_for: float) -> None:
        self.send(message(Kind.QUIET, silent_for=round(silent_for, 3)))

    def spoke(self) -> None:
        self.send(message(Kind.SPOKE))

    def _dump(self, msg: dict[str, Any]) -> None:
        def answer(stacks: list[RankStack], problem: str | None) -> None:
            self.send(message(Kind.STACKS, id=msg.get("id"), stacks=[s.to_json() for s in stacks], problem=problem))

        if self._doctor is None:  # --elastic: torch's agent owns the workers
            answer([], f"no stacks from {socket.gethostname()}: not taken under --elastic")
        else:
            self._doctor.dump(answer)

    # -- plumbing -------------------------------------------------------------------------------------------

    def send(self, msg: dict[str, Any]) -> None:
        """Send now, or, while the console's thread is in a forward (``forward_output``), leave it to that thread:
        the event loop never waits for a forward that node 0 is slow to read (issue 25 §3)."""
        if not self._connected:
            return
        self._outbox.append(msg)
        self._send_waiting()

    def _send_waiting(self, wait: float = 0.0) -> None:
        """Send what waits, if no other thread is sending (within ``wait`` s); the thread that is sends it after
        its own message."""
        while self._outbox and self._send_lock.acquire(timeout=wait if wait > 0 else -1, blocking=wait > 0):
            try:
                while self._outbox:
                    self._link.send(self._outbox.popleft())
            except OSError:
                self._connected = False  # the reader thread reports the loss
                self._outbox.clear()
            finally:
                self._send_lock.release()

    def forward_output(self, fd: int, data: bytes) -> bool:
        """Pod mode: hand a console write to node 0 (xrun.launch.output.consoleroute). False: the channel is gone.
        Called by the console's thread (xrun.launch.output.writer), never by the event loop: it may block."""
        if not self._connected:
            return False
        try:
            with self._send_lock:
                self._link.send(channel.output_message(fd, data))
        except OSError:
            self._connected = False
        self._send_waiting()  # what the loop handed over meanwhile
        return self._connected

    def next_message(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message the hooks do not handle themselves; None once the channel is lost.
        Raises ``queue.Empty`` after ``timeout`` seconds."""
        return self._inbox.get(timeout=timeout)

    def close(self) -> None:
        """After the result went out: end the reader thread first, then release the fds it uses."""
        self._closing = True
        self._connected = False
        try:
            self._link.sock.shutdown(socket.SHUT_RDWR)  # the thread's recv returns at once
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._link.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _read_forever(self) -> None:
        while True:
            try:
                msg = self._link.recv(timeout=channel.DEAD_AFTER)
            except ChannelError as err:
                if self._closing:
                    return
                reason = err.reason if "no message" not in err.reason else f"runner silent for {channel.DEAD_AFTER:g} s"
                self.lost_reason = reason
                self._post("lost", reason)
                self._inbox.put(None)
                return
            self.heard = True
            kind = msg.get("type")
            if self._between and kind != Kind.PING.value:
                self._between = kind != Kind.START.value  # from the start on, a stop is the next group's
                self._inbox.put(msg)
            elif kind == Kind.PING.value:
                self.send(message(Kind.PONG))
            elif kind == Kind.STOP.value:
                self._post("stop", msg)
            elif kind in (Kind.SIGNAL.value, Kind.DUMP.value):
                self._post(kind, msg)
            else:
                self._inbox.put(msg)

    def _post(self, what: str, payload: Any) -> None:
        self._events.put((what, payload))
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass

    def _on_wake(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except OSError:
            pass
        while True:
            try:
                what, payload = self._events.get_nowait()
            except queue.Empty:
                return
            if what == Kind.SIGNAL.value:
                self._forward(payload)
            elif what == Kind.DUMP.value:
                self._dump(payload)
            elif what == "stop":
                signum = int(payload.get("signal") or signal.SIGTERM)
                if payload.get("stacks") and self._doctor is not None and signum != signal.SIGKILL:
                    self._doctor.take_stop_stacks()  # another node failed first: what were these doing?
                self._group.request_stop(signum, str(payload.get("reason") or "the runner asked to stop"))
            else:
                self._connected = False
                self._group.request_stop(signal.SIGTERM, f"lost the control channel to the runner: {payload}")


    def _forward(self, msg: dict[str, Any]) -> None:
        signum = msg.get("signal")
        if isinstance(signum, int):
            self._group.forward_signal(signum)  # a RankGroup, or the elastic StopBridge


def wait_for_start(link: Link) -> dict[str, Any] | None:
    """Block at the barrier (see ``serve_until``). Returns the start message, or None when told to stop."""
    ends: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {
        Kind.START.value: lambda msg: msg, Kind.STOP.value: lambda msg: None}
    return serve_until(link, ends)


def serve_until(link: Link, ends: Mapping[str, Callable[[dict[str, Any]], T]]) -> T:
    """Answer the runner's pings and, with ``--precheck``, its probe commands (issue 24: the network check across
    the nodes, spares included, before any rank starts) until a message of a kind in ``ends``, whose answer it
    returns. A silence longer than the keepalive's bound is the runner's loss (``ChannelError``)."""
    probes = ProbeAnswers(link.send)
    try:
        while True:
            msg = link.recv(timeout=channel.DEAD_AFTER)
            kind = msg.get("type")
            end = ends.get(kind) if isinstance(kind, str) else None
            if end is not None:
                return end(msg)
            if kind == Kind.PING.value:
                link.send(message(Kind.PONG))
            elif kind in (Kind.PROBE_OPEN.value, Kind.PROBE.value):
                probes.handle(msg)
    finally:
        probes.close()


def node0_port(host: str, first: Mapping[str, Any], *, near: str) -> int | None:
    """Node 0's check of rank 0's port before it reports ready (issue 17): the port it will use when the runner
    lets it pick (``pick_master_port``, the default kept where free), the given port when free, else
    ``PortBusyError``. None for every other node (the spec says no port)."""
    pick, port = bool(first.get("pick_master_port")), first.get("master_port")
    port = port if isinstance(port, int) and not isinstance(port, bool) else 0
    if not pick and not port:
        return None
    return master_port(host, port, pick=pick, near=near)


def run_connected(host: str, port: int, node_rank: int, credentials: Credentials, *, engine: bool = False) -> int:
    """This node's part of the job; its exit code (``engine``: see ``engine_exit_code``)."""
    link = secure_link(host, port, node_rank, credentials)
    try:
        first = link.recv(timeout=SPEC_TIMEOUT)
    except ChannelError as err:
        raise ChannelError(f"the runner did not accept this agent ({err.reason}): the job was already ending, "
                           "another agent holds this node's place, or the token is stale or wrong") from None
    if first.get("type") != Kind.SPEC.value:
        raise ChannelError(f"expected the node spec, got {first.get('type')!r}")
    if first.get("standby"):  # a hot spare (--spares): preflight, then wait for a lost node's spec or the end
        from xrun.launch.restarts import stand_by

        taken = stand_by(link, first)
        if isinstance(taken, int):
            return engine_exit_code(taken, delivered=True) if engine else taken
        first = taken
    spec = use_spec(link, first)
    try:
        check_spec(spec)  # the script, interpreter and log files here, before the barrier counts this node ready
        rank0_port = node0_port(spec.host, first, near=link.sock.getsockname()[0])  # a given --master_port taken
    except XrunError as err:  # the runner says it, naming this host, and ends the job with its code: one line
        link.send(refusal(err))
        return err.exit_code
    link.send(message(Kind.READY, master_port=rank0_port))
    start = through_barrier(link, first, spec, engine=engine)
    if isinstance(start, int):
        return start
    from xrun.launch.agent import run_node

    hooks = ChannelHooks(link)
    try:
        attempt = int(start.get("restart_count") or 0)  # a hot spare starts at the attempt it joins
        code = run_node(with_rendezvous(spec, str(start["master_addr"]), int(start["master_port"]), attempt),
                        hooks=hooks)
        if first.get("max_restarts"):  # the runner may start the job again: wait for its word
            from xrun.launch.restarts import next_attempts

            code = next_attempts(hooks, spec, code, near=link.sock.getsockname()[0])
    finally:
        hooks.close()
    return engine_exit_code(code, delivered=hooks.result_delivered) if engine else code


def through_barrier(link: Link, first: Mapping[str, Any], spec: NodeSpec, *, engine: bool) -> dict[str, Any] | int:
    """The start message, or the agent's exit code when it was stopped at the barrier (another node failed,
    --precheck found a bad node). With --max_restarts the stop ends the attempt, not the agent: it waits for the
    runner's next word (a restart, maybe with a hot spare in the failed node's place, or the verdict)."""
    start: dict[str, Any] | int | None = wait_for_start(link)
    if start is None and first.get("max_restarts"):
        from xrun.launch.restarts import after_barrier_stop

        start = after_barrier_stop(link, spec, near=link.sock.getsockname()[0])
        if isinstance(start, int):
            return engine_exit_code(start, delivered=True) if engine else start
    if start is None:
        return stopped_at_barrier(link, engine=engine)
    return start


def stopped_at_barrier(link: Link, *, engine: bool) -> int:
    """The node's ``done`` when the runner stopped the job before any rank started (the runner then has every node
    over at once, not after a dropped connection each); to an engine, 0 once it went out (``engine_exit_code``)."""
    code = 128 + signal.SIGTERM
    try:
        link.send(message(Kind.DONE, exit_code=code))
    except OSError:
        return code
    return engine_exit_code(code, delivered=True) if engine else code


def use_spec(link: Link, first: Mapping[str, Any]) -> NodeSpec:
    """The node spec the runner sent (the preflight enters its working directory); a spec this agent cannot use
    is said to the runner and raised as one line (``XrunError``, else ``ChannelError``), never as a traceback."""
    try:
        spec = NodeSpec.from_json(first["spec"])  # KeyError, or a non-object: caught below
    except (XrunError, LookupError, TypeError, ValueError, AttributeError) as err:
        link.send(message(Kind.ERROR, message=f"cannot use the node spec: {err}"))
        if isinstance(err, XrunError):
            raise
        raise ChannelError(f"cannot use the node spec: {err.__class__.__name__}: {err}") from None
    return spec


def engine_exit_code(code: int, *, delivered: bool) -> int:
    """What an agent started by an engine (mpirun, hydra, srun) exits with: 0 once its result reached the runner.

    The runner decides the job's exit code from the channel and has already stopped every other node; a non-zero
    exit would only set off the engine's own abort, and OpenMPI's sends SIGCONT, sleeps 1 s, SIGTERM, sleeps 1 s,
    SIGKILL to the agent even when it is already gone (``odls_base_sigkill_timeout``, strace of mpirun 4.1):
    2.2 s before mpirun exits, against 0.1 s. When the channel was lost the code stands: then the engine's
    abort is the second line of teardown.
    """
    return 0 if delivered else code


def main(argv: Sequence[str]) -> int:
    raise_open_files_limit()  # before the channel and the ranks' pipes: not the login's 1,024 (xrun.fdlimit)
    try:
        ns = parse_connect_args(argv)
        host, port = split_endpoint(ns.connect)
        node_rank = ns.node_index(os.environ)
        if ns.node_rank_from is not None:  # started by mpirun/mpiexec/srun: ranks must not look like its processes
            drop_engine_identity(os.environ)
            restore_home(os.environ)
        credentials = read_credentials(ns.token, ns.fingerprint, node_rank)
        return run_connected(host, port, node_rank, credentials, engine=ns.node_rank_from is not None)
    except XrunError as err:
        print(f"xrun.launch: {one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    except ChannelError as err:
        print(f"xrun.launch[{socket.gethostname()}]: {one_line(err.reason)}", file=sys.stderr)
        return EXIT_NO_RUNNER
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
