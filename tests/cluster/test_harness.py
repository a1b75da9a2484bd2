"""The cluster harness itself: real sshds, real pdsh, real namespaces, and a clean machine afterwards."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import eventually

from . import conftest, harness
from .harness import Cluster, ClusterBusy

REPO = Path(__file__).resolve().parents[2]
MACHINE_HOSTNAME = Path("/proc/sys/kernel/hostname").read_text().strip()


def _marker() -> str:
    return f"XRUN_CLUSTER_TEST={uuid.uuid4().hex}"


def _env_with(marker: str) -> dict[str, str]:
    name, value = marker.split("=", 1)
    return {**os.environ, name: value}


def _connects(address: str, port: int = 22, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


# -- the shared cluster ------------------------------------------------------------------------------------------


def test_ssh_to_each_node_returns_its_own_hostname(cluster):
    assert [n.name for n in cluster.nodes] == ["node1", "node2", "node3"]
    for node in cluster.nodes:
        with_config = cluster.ssh(node, ["hostname"])
        assert (with_config.returncode, with_config.stdout, with_config.stderr) == (0, f"{node.name}\n", "")
        # Plain ssh finds the drop-in in /etc/ssh/ssh_config.d/, as pdsh, mpirun and srun do.
        plain = subprocess.run(["ssh", node.name, "hostname"], capture_output=True, text=True, timeout=30)
        assert (plain.returncode, plain.stdout) == (0, f"{node.name}\n"), plain.stderr
    assert Path("/proc/sys/kernel/hostname").read_text().strip() == MACHINE_HOSTNAME


def test_host_key_checking_stays_on(cluster, tmp_path):
    wrong = tmp_path / "known_hosts"
    wrong.write_text("node1 " + Path(cluster.identity).with_suffix(".pub").read_text())  # the client key
    argv = cluster.ssh_argv("node1", ["true"])
    result = subprocess.run(
        [argv[0], "-o", f"UserKnownHostsFile={wrong}", *argv[1:]], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr


def test_run_on_enters_the_nodes_namespaces(cluster):
    node = cluster.node("node2")
    assert cluster.run_on(node, ["hostname"]).stdout == "node2\n"
    addr = cluster.run_on(node, ["ip", "-o", "-4", "addr", "show", "dev", cluster.iface]).stdout
    assert f"inet {node.address}/24" in addr
    routes = cluster.run_on(node, ["ip", "route"]).stdout.splitlines()
    assert routes == [f"10.77.0.0/24 dev {cluster.iface} proto kernel scope link src {node.address} "]  # no default


def test_pdsh_reaches_all_nodes_and_expands_rank(cluster):
    result = subprocess.run(
        ["pdsh", "-R", "ssh", "-w", "node[1-3]", "echo", "$(hostname)", "host=%h", "rank=%n"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "node1: node1 host=node1 rank=0",
        "node2: node2 host=node2 rank=1",
        "node3: node3 host=node3 rank=2",
    ]


def test_nodes_reach_each_other_by_name(cluster):
    server = cluster.popen_on(
        "node1",
        [
            cluster.python,
            "-c",
            "import socket\n"
            "s = socket.create_server(('0.0.0.0', 47001))\n"
            "print('ready', flush=True)\n"
            "conn, peer = s.accept()\n"
            "conn.sendall(f'{socket.gethostname()} saw {peer[0]}'.encode())\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline() == "ready\n"
        client = "import socket; print(socket.create_connection(('node1', 47001), timeout=5).recv(100).decode())"
        result = cluster.ssh("node2", [cluster.python, "-c", client])  # absolute interpreter: system PATH remotely
        assert (result.returncode, result.stdout) == (0, "node1 saw 10.77.0.12\n"), result.stderr
        # A node is a head node too: ssh from inside node1 uses the same drop-in and known_hosts.
        assert cluster.run_on("node1", ["ssh", "node2", "hostname"]).stdout == "node2\n"
    finally:
        server.kill()
        server.wait()


def test_marked_process_started_over_ssh_is_found_on_its_node(cluster):
    marker = _marker()
    started = cluster.ssh("node3", f"{marker} nohup sleep 300 >/dev/null 2>&1 &")
    assert started.returncode == 0, started.stderr
    assert eventually(lambda: len(cluster.processes_with_marker(marker)) == 1)
    (pid,) = cluster.processes_with_marker(marker)
    assert pid in cluster.pids("node3")
    assert pid not in cluster.pids("node1")


def test_kill_node_kills_everything_on_it_and_revive_restarts_sshd(cluster):
    marker = _marker()
    sleeper = cluster.popen_on("node3", ["sleep", "300"], env=_env_with(marker))
    assert cluster.ssh("node3", f"{marker} nohup sleep 300 >/dev/null 2>&1 &").returncode == 0
    assert eventually(lambda: len(cluster.processes_with_marker(marker)) == 2)

    cluster.kill_node("node3")

    assert sleeper.wait(timeout=5) == -9
    assert cluster.processes_with_marker(marker) == []
    assert cluster.pids("node3") == []
    assert cluster.sshd_pid("node3") is None
    refused = cluster.ssh("node3", ["true"], timeout=10)
    assert refused.returncode == 255 and "Connection refused" in refused.stderr  # the address still answers
    assert cluster.ssh("node1", ["hostname"]).stdout == "node1\n"  # the others are untouched

    cluster.revive("node3")
    assert cluster.ssh("node3", ["hostname"]).stdout == "node3\n"


def test_cut_isolates_a_node_and_heal_restores_it(cluster):
    node2 = cluster.node("node2")
    assert _connects(node2.address)
    peer_probe = [cluster.python, "-c", "import socket; socket.create_connection(('node2', 22), timeout=0.5)"]

    cluster.cut(node2)
    try:
        assert not _connects(node2.address)
        assert cluster.run_on("node1", peer_probe).returncode != 0
        assert cluster.sshd_pid(node2) is not None  # the node runs on, only its network is gone
    finally:
        cluster.heal(node2)

    assert cluster.run_on("node1", peer_probe).returncode == 0
    assert cluster.ssh(node2, ["hostname"]).stdout == "node2\n"


BURN = "import time\nt, w = time.process_time(), time.monotonic()\nwhile time.process_time() - t < 0.2: pass\nprint(time.monotonic() - w)"


def test_cpu_limited_throttles_what_runs_on_the_node_and_leaves_no_cgroup(cluster):
    conftest.require_cpu_limit()
    controller = harness.cpu_controller()
    sshd = cluster.sshd_pid("node3")
    home = controller.group_of(sshd)
    marker = _marker()
    with cluster.cpu_limited("node3", 0.1) as group:
        assert controller.group_of(sshd) == group
        assert cluster.ssh("node3", f"{marker} nohup sleep 300 >/dev/null 2>&1 &").returncode == 0
        throttled = float(cluster.ssh("node3", [cluster.python, "-c", BURN]).stdout)  # 0.2 s of CPU at 10%
        free = float(cluster.ssh("node1", [cluster.python, "-c", BURN]).stdout)
        (sleeper,) = cluster.processes_with_marker(marker)
        assert controller.group_of(sleeper) == group
    assert throttled > 1.2 and throttled > 2 * free, (throttled, free)
    assert not group.exists() and controller.group_of(sshd) == home and controller.group_of(sleeper) == home
    assert not [item for item in harness.leftovers(cluster.id) if item.startswith("cgroup")]
    with pytest.raises(RuntimeError, match="the body failed"), cluster.cpu_limited("node3", 0.1) as group:
        raise RuntimeError("the body failed")
    assert not group.exists() and controller.group_of(sshd) == home


def test_hostfile(cluster, tmp_path):
    assert cluster.hostfile(tmp_path / "all").read_text() == "node1 slots=2\nnode2 slots=2\nnode3 slots=2\n"
    some = cluster.hostfile(tmp_path / "some", slots=4, nodes=["node3", 1])
    assert some.read_text() == "node3 slots=4\nnode1 slots=4\n"


def test_paramiko_with_the_exposed_paths(cluster):
    paramiko = pytest.importorskip("paramiko")
    config = paramiko.SSHConfig.from_path(str(cluster.ssh_config)).lookup("node2")
    client = paramiko.SSHClient()
    client.load_host_keys(str(cluster.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())  # host-key checking stays on
    client.connect(
        config["hostname"], username=config["user"], key_filename=config["identityfile"][0], timeout=5,
        allow_agent=False, look_for_keys=False,
    )  # fmt: skip
    try:
        _, stdout, _ = client.exec_command("hostname")
        assert stdout.read().decode() == "node2\n"
    finally:
        client.close()


# -- clusters of their own: bring-up, teardown, crashes ----------------------------------------------------------


def test_teardown_leaves_nothing_behind(make_cluster):
    c = make_cluster(2)
    cluster_id, workdir, sshds = c.id, c.workdir, [c.sshd_pid(n) for n in c.nodes]
    marker = _marker()
    stray = c.popen_on("node1", ["sleep", "300"], env=_env_with(marker))
    assert c.ssh("node2", f"{marker} nohup sleep 300 >/dev/null 2>&1 &").returncode == 0
    assert harness.DROP_IN.exists() and "node2" in harness.HOSTS.read_text()

    c.down()  # checks, under the machine lock, that nothing tagged is left; this test checks it again

    # By id: another session waiting for the machine may bring up its own node1.. the moment we are done.
    assert harness.leftovers(cluster_id) == []
    assert stray.wait(timeout=5) == -9
    assert processes_gone(sshds) and c.processes_with_marker(marker) == []
    assert not workdir.exists()
    assert f"# xrun-cluster {cluster_id}" not in harness.HOSTS.read_text()
    assert not harness.DROP_IN.exists() or cluster_id not in harness.DROP_IN.read_text()
    assert Path("/proc/sys/kernel/hostname").read_text().strip() == MACHINE_HOSTNAME
    assert c.timings["up"] < 5 and c.timings["down"] < 5
    c.down()  # idempotent


def processes_gone(pids):
    return all(not harness._running(pid) for pid in pids)


@pytest.mark.parametrize("step", ["_make_network", "_make_uts", "_write_hosts", "_write_ssh_files", "_start_sshds"])
def test_failure_halfway_through_bring_up_cleans_up(make_cluster, monkeypatch, step):
    original = getattr(Cluster, step)
    ids = []

    def fail_after(self, *args, **kwargs):
        ids.append(self.id)
        original(self, *args, **kwargs)  # the step's work is done and must be undone
        raise RuntimeError(f"injected failure after {step}")

    monkeypatch.setattr(Cluster, step, fail_after)
    with pytest.raises(RuntimeError, match="injected failure"):
        make_cluster(2)
    assert ids and harness.leftovers(ids[0]) == []


def test_leftovers_of_a_crashed_run_are_cleaned_by_the_next_up(make_cluster):
    owner = (
        f"import json, sys, time; sys.path.insert(0, {str(Path(harness.__file__).parent)!r}); import harness\n"
        "c = harness.Cluster(2).up()\n"
        "if harness.cpu_controller() is not None:\n"
        "    limit = c.cpu_limited('node2', 0.5)  # a throttled node's cgroup, never left (kept: not collected)\n"
        "    limit.__enter__()\n"
        "print(json.dumps(c.to_state()), flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    try:
        state = json.loads(proc.stdout.readline())
    finally:
        # Crash it while holding the machine lock, so no other session's waiting `up` cleans up before we look.
        with harness._machine_lock():
            proc.kill()
            proc.wait()
            left = harness.leftovers(state["id"])
    assert "netns xrc-node1" in left and any(item.startswith("process") for item in left)
    assert any(item.startswith("cgroup") for item in left) == (harness.cpu_controller() is not None), left

    c = make_cluster(3)

    assert processes_gone(state["sshd_pids"].values())
    assert harness.leftovers(state["id"]) == []
    assert c.ssh("node1", ["hostname"]).stdout == "node1\n"


def test_only_one_cluster_at_a_time(make_cluster):
    make_cluster(1)
    with pytest.raises(ClusterBusy, match="this process already has a cluster up"):
        Cluster(1, busy_timeout=0).up()
    other = (
        f"import sys; sys.path.insert(0, {str(Path(harness.__file__).parent)!r}); import harness\n"
        "harness.Cluster(1, busy_timeout=0.3).up()\n"
    )
    waited = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, timeout=60)
    assert waited.returncode == 1 and "ClusterBusy: the machine holds a live cluster" in waited.stderr


def test_cli_up_status_down(make_cluster, tmp_path):
    # make_cluster (unused) frees the machine: the CLI's cluster must not meet the shared one.
    state = tmp_path / "state.json"
    cli = [sys.executable, "-m", "tests.cluster.harness"]

    up = subprocess.run(
        [*cli, "up", "2", "--state", str(state), "--wait", "600"], cwd=REPO, capture_output=True, text=True, timeout=660
    )
    assert up.returncode == 0, up.stderr
    info = json.loads(state.read_text())
    assert f"ssh -F {info['ssh_config']} node1 hostname" in up.stdout
    ssh = subprocess.run(["ssh", "-F", info["ssh_config"], "node2", "hostname"], capture_output=True, text=True)
    assert ssh.stdout == "node2\n", ssh.stderr
    status = subprocess.run([*cli, "status"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "started by `harness up`" in status.stdout

    refused = subprocess.run([*cli, "down"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "not touching live clusters" in refused.stderr
    down = subprocess.run([*cli, "down", "--state", str(state)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert harness.leftovers(info["id"]) == [] and not state.exists()


# -- skip or fail ------------------------------------------------------------------------------------------------


def test_missing_requirements_skip_with_the_reason_or_fail_under_ci(monkeypatch):
    monkeypatch.setattr(conftest, "missing_requirements", lambda extra_tools=(): ["missing tools: pdsh"])
    monkeypatch.delenv(conftest.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="missing tools: pdsh"):
        conftest.require_cluster()
    monkeypatch.setenv(conftest.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="XRUN_REQUIRE_CLUSTER=1"):
        conftest.require_cluster()
