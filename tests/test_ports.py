"""Rank 0's port never collides (issue 17, part 2): a free port without --master_port, node 0's pick handed to
every node at the barrier (pod mode here, the head's channel in tests/cluster), an explicit taken port refused
in one line naming its holder before any rank starts, and the failure report naming each fact once.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_xrun
from tests.test_pod_run import Pod
from xrun import net
from xrun.common.result.failure_report import format_failure_report
from xrun.common.result.outcome import NodeResult, RankOutcome
from xrun.errors import PortBusyError
from xrun.net import master_port, port_in_use
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import AgentError, HelloReceived, Ready, SendSpec, SendStart
from xrun.runner.job.hello_policy import SendSpecs
from xrun.runner.job.machine import Job


@pytest.fixture
def held_port():
    """A port this test process listens on (so psutil can name the holder: this very process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_given_free_port_is_kept_and_a_taken_one_is_refused_naming_its_holder(held_port):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert master_port("n0", free, pick=False) == free
    with pytest.raises(PortBusyError) as caught:
        master_port("n0", held_port, pick=False)
    err = caught.value
    assert (err.host, err.port, err.exit_code) == ("n0", held_port, 2)
    assert err.holder.startswith(f"pid {os.getpid()} (")
    assert str(err).startswith(f"--master_port: port {held_port} is already in use on n0 by pid {os.getpid()} (")


def test_picking_keeps_a_free_preference_and_replaces_a_taken_one(held_port):
    assert port_in_use(held_port)
    picked = master_port("n0", held_port, pick=True)
    assert picked != held_port and not port_in_use(picked)
    assert master_port("n0", picked, pick=True) == picked
    assert master_port("n0", 0, pick=True) > 0


@pytest.mark.parametrize(
    "config, ready_port, spec, start_port",
    [
        # no --master_port on several nodes: node 0 tries 29500 and reports what it took
        (dict(master_port=29500, pick_master_port=True), 41000, SendSpec(0, True, 29500), 41000),
        # --master_port 0: any free port
        (dict(master_port=0), 41001, SendSpec(0, True, 0), 41001),
        # --master_port N: node 0 checks it; the job uses N
        (dict(master_port=23456), None, SendSpec(0, False, 23456), 23456),
    ],
)
def test_node0_checks_or_picks_and_the_start_carries_its_port(config, ready_port, spec, start_port):
    job = Job(JobConfig(hosts=("a", "b"), join_timeout=30, shutdown_timeout=5, world_size=2, **config), now=0.0)
    actions = job.handle(HelloReceived(node=0, conn=1, addr="10.0.0.1", peer="10.0.0.1"), now=0.1)
    assert spec in actions
    job.handle(HelloReceived(node=1, conn=2, addr="10.0.0.2", peer="10.0.0.2"), now=0.1)
    job.handle(Ready(1), now=0.2)
    actions = job.handle(Ready(0, ready_port), now=0.3)
    assert SendStart((0, 1), "10.0.0.1", start_port) in actions


def test_a_taken_explicit_port_ends_the_job_with_exit_2():
    job = Job(JobConfig(hosts=("a", "b"), join_timeout=30, shutdown_timeout=5, world_size=2, master_port=23456),
              now=0.0)
    assert isinstance(job.policy, SendSpecs)
    job.handle(HelloReceived(node=0, conn=1, addr="10.0.0.1", peer="10.0.0.1"), now=0.1)
    job.handle(AgentError(0, "--master_port: port 23456 is already in use on a by pid 7 (python)", 2), now=0.2)
    assert job.failure is not None and job.failure.exit_code == 2
    assert "port 23456 is already in use on a by pid 7" in job.failure.reason


def _outcome(**kw):
    base = dict(host="n", rank=0, local_rank=0, pid=10, returncode=1, signal=None, runtime_s=2.97,
                stopped_by_xrun=False, stderr_tail=("boom",))
    return RankOutcome(**{**base, **kw})


def test_the_report_names_the_exit_code_once():
    root = _outcome()
    text = format_failure_report(NodeResult("n", (root,), root, None, 1))
    assert text.splitlines()[0] == "xrun: node n: rank 0 failed: exit code 1 after 2.97 s"


# ---------------------------------------------------------------------------------------------------------------
# Real runs.


def test_local_dry_run_says_the_port_is_chosen_per_run():
    text = run_xrun("--dry-run", "t.py")
    assert text.returncode == 0, text.stderr
    assert "master port: a free one, drawn again by each run (no --master_port)" in text.stdout
    data = json.loads(run_xrun("--dry-run=json", "t.py").stdout)
    assert data["master_port_choice"] == "free" and data["master_port"] != 29500
    given = json.loads(run_xrun("--dry-run=json", "--master_port", "29500", "t.py").stdout)
    assert given["master_port_choice"] == "given"
    remote = run_xrun("--dry-run", "-H", "hostfiles/two-workers", "t.py")
    assert ("master port: 29500 if free on worker-0, else a free one there, chosen by node 0's agent at the start "
            "barrier") in remote.stdout


def test_an_explicit_taken_port_is_one_line_before_any_rank_starts(tmp_path, held_port):
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = run_xrun("--master_port", str(held_port), str(script))
    assert result.returncode == 2
    assert result.stderr == (f"xrun: --master_port: port {held_port} is already in use on localhost by pid "
                             f"{os.getpid()} ({_name(os.getpid())}); leave --master_port out to use a free port, "
                             "or pick another\n")
    assert not marker.exists()


def _name(pid):
    import psutil

    return psutil.Process(pid).name()


@pytest.mark.slow
def test_two_concurrent_local_gloo_jobs_with_default_flags_both_succeed():
    pytest.importorskip("torch")
    argv = [sys.executable, "-m", "xrun", "--num_gpus", "2", "examples/train_ddp.py", "--steps", "3"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    jobs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    for job in jobs:
        out, err = job.communicate(timeout=240)
        assert job.returncode == 0, err
        assert "EADDRINUSE" not in err and "address already in use" not in err.lower()


class _DefaultPortPod(Pod):
    """Pod mode with no --master_port: node 0 (127.0.0.1) keeps 29500 where free, else picks one for all."""

    def start(self, node, *, script="train.py", env=None):
        argv = [sys.executable, "-m", "xrun", "-H", str(self.tmp / "hosts"), "--pod", "--node_rank", str(node),
                "--control_port", str(self.ports[1]), "--join_timeout", str(self.join_timeout), script]
        self.procs[node] = subprocess.Popen(argv, env={**self.env, **(env or {})}, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, cwd=str(self.tmp))
        return self.procs[node]


@contextlib.contextmanager
def default_port_held():
    """29500 listened on here for the block (or already held by somebody else: busy all the same)."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            holder.bind(("127.0.0.1", 29500))
            holder.listen()
        except OSError:
            pass
        yield
    finally:
        holder.close()


@pytest.mark.slow
def test_pod_mode_with_the_default_port_taken_on_node_0_still_runs(tmp_path):
    with default_port_held():
        assert port_in_use(29500)
        pod = _DefaultPortPod(tmp_path)
        (tmp_path / "train.py").write_text("import os; print('port', os.environ['MASTER_PORT'], flush=True)\n")
        for node in (0, 1, 2):
            pod.start(node)
        out = pod.finish()
    ports = set()
    for code, stdout, stderr in out.values():
        assert code == 0, stderr
        ports.update(line.rsplit(" ", 1)[-1] for line in stdout.splitlines() if "port " in line)
    assert len(ports) == 1 and ports != {"29500"}, out


def test_check_notes_a_busy_default_port_and_fails_a_busy_given_one():
    with default_port_held():
        default = run_xrun("check")
        assert default.returncode == 0, default.stdout + default.stderr
        assert "port 29500 IN USE (no --master_port: a free one will be used)" in default.stdout
        given = run_xrun("check", "--master_port", "29500")
        assert given.returncode == 1 and "master port 29500 is in use on localhost" in given.stdout


@pytest.mark.parametrize(
    "ephemeral, window",
    [
        ((32768, 60999), range(20000, 32768)),  # Linux's default: below the range
        ((20001, 60999), range(20000, 20001)),
        ((20000, 60999), range(61000, 65536)),  # starts at PICK_FROM: above the range instead
        ((1024, 65000), range(65001, 65536)),
        ((1024, 5000), range(20000, 65536)),
        ((1024, 65535), range(0)),  # nothing outside it: bind(0) is all that is left
        ((1, 65535), range(0)),  # what an unreadable /proc reads as
    ],
)
def test_the_pick_window_lies_outside_the_ephemeral_range(ephemeral, window):
    """A port from bind(0) may be handed to an outgoing connection (even a rank's self-connect to it) before rank 0
    binds it: EADDRINUSE in a busy CI run. xrun picks outside the kernel's ephemeral range instead, below it where
    there is room above PICK_FROM, else above it."""
    assert net.pick_window(ephemeral) == window
    low, high = ephemeral
    assert not any(low <= port <= high for port in window)


def test_the_ephemeral_range_is_read_and_an_unreadable_one_is_the_whole_space(tmp_path):
    given = tmp_path / "range"
    given.write_text("10000\t20000\n")
    assert net.ephemeral_range(str(given)) == (10000, 20000)
    given.write_text("garbage\n")
    assert net.ephemeral_range(str(given)) == (1, 65535)
    assert net.ephemeral_range(str(tmp_path / "missing")) == (1, 65535)


@pytest.mark.parametrize("ephemeral", [None, (32768, 60999), (10000, 60999), (1024, 65535)])
def test_a_free_port_is_picked_outside_the_ephemeral_range_and_is_free(ephemeral):
    """Real sockets on this host, with its own range (None) and with a low, a high and a whole-space range given:
    each pick lies outside the range it was given, or comes from bind(0) where nothing lies outside it."""
    low, high = net.ephemeral_range() if ephemeral is None else ephemeral
    window = net.pick_window((low, high))
    for _ in range(20):
        port = net.free_port("127.0.0.1", ephemeral=ephemeral)
        assert port in window if window else port > 0
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # and it is free
