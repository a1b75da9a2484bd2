"""Golden tests: the exact commands the ssh and pdsh backends run for a fixed plan (whole strings)."""

import shlex
import subprocess
import sys
import time

import psutil
import pytest

from xrun.channel import ChannelError
from xrun.channel.link import Credentials
from xrun.common.command import connect_argv, connect_target, token_from_env
from xrun.common.rankplan import LaunchOptions
from xrun.errors import UsageError
from xrun.joined.entry import IN_PROCESS
from xrun.launch.session.connection import Server, connect
from xrun.launch.session.main import AgentArgs, build_parser, parse_args, split_endpoint
from xrun.runner.backends import known_backends
from xrun.runner.backends.base import get_backend
from xrun.runner.backends.channel import Endpoint, agent_connect_argv
from xrun.runner.backends.launcher_process import LaunchedHosts
from xrun.runner.backends.pdsh import PdshSession, pdsh_argv, ssh_args_append
from xrun.runner.backends.ssh import ssh_commands
from xrun.runner.plan import JobRequest, make_plan
from xrun.runner.remote_options import RemoteOptions, SshSettings
from xrun.shell import render

PY = "/opt/py/bin/python3"
WORLD = {"node1": (0, 1), "node2": (0, 1), "node3": (0,)}
FINGERPRINT = "abababababababababababababababababababababababababababababababab"
ENDPOINT = Endpoint("10.77.0.1", 40123, "f00d", FINGERPRINT)


def plan_for(backend, **request):
    request.setdefault("launch", LaunchOptions(python=PY))
    return make_plan(JobRequest(script="train.py", args=("--lr", "3e-4"), run_id="r1", **request), WORLD, backend)


def test_registry_knows_remote_backends():
    assert {"local", "no_ssh", "pdsh", "ssh"} <= set(known_backends())


def test_pdsh_command_golden():
    argv = pdsh_argv(plan_for("pdsh"), ENDPOINT)
    assert render(argv) == (
        "pdsh -S -R ssh -f 1024 -N -w node1,node2,node3 "
        "'/opt/py/bin/python3 -u -m xrun.launch --connect=10.77.0.1:40123 --fingerprint=abababababababababababababababababababababababababababababababab --node_rank=%n --token=announce'"
    )


def test_pdsh_fanout_and_ssh_args():
    remote = RemoteOptions(fanout=8, ssh_port=2222, ssh_config="/etc/my ssh", accept_new_hosts=True)
    argv = pdsh_argv(plan_for("pdsh", remote=remote), ENDPOINT)
    assert argv[:6] == ("pdsh", "-S", "-R", "ssh", "-f", "8")
    assert ssh_args_append(remote) == (
        "-p 2222 -F '/etc/my ssh' -o StrictHostKeyChecking=accept-new -o BatchMode=yes"
    )


def test_ssh_commands_golden():
    endpoints = {h: ENDPOINT for h in WORLD}
    rendered = [(c.host, render(c.argv)) for c in ssh_commands(plan_for("ssh"), endpoints)]
    assert rendered == [
        (f"node{i}", f"/opt/py/bin/python3 -u -m xrun.launch --connect=10.77.0.1:40123 --fingerprint=abababababababababababababababababababababababababababababababab --node_rank={i - 1} --token=-")
        for i in (1, 2, 3)
    ]


def test_ipv6_endpoint_is_bracketed():
    argv = agent_connect_argv(PY, Endpoint("fd00::1", 5, "t", FINGERPRINT), "0", token_on_stdin=True)
    assert argv[4] == "--connect=[fd00::1]:5"


@pytest.mark.parametrize("addr", ["10.77.0.1", "fd00::1", "node-1.cluster"])
def test_connect_target_round_trips_through_the_agents_parser(addr):
    assert split_endpoint(connect_target(addr, 40123)) == (addr, 40123)


@pytest.mark.parametrize(
    "rank, expected",
    [({"node_rank": 3}, (3, None)), ({"node_rank_from": ("PMI_RANK", "PMIX_RANK")}, (None, "PMI_RANK,PMIX_RANK"))],
)
def test_connect_argv_is_what_the_agent_parses(rank, expected):
    argv = connect_argv(PY, connect=ENDPOINT.connect, token=token_from_env("XRUN_TOKEN"), fingerprint=FINGERPRINT,
                        **rank)
    assert argv[:4] == (PY, "-u", "-m", "xrun.launch")
    ns = build_parser().parse_args(list(argv[4:]))
    assert (ns.connect, ns.node_rank, ns.node_rank_from, ns.token, ns.fingerprint) == (
        "10.77.0.1:40123", *expected, "env:XRUN_TOKEN", FINGERPRINT)


def test_every_connect_argv_is_read_back():
    """Every form connect_argv renders is read back as it was meant (pdsh puts the node number in for ``%n``)."""
    for rank, (node_rank, node_rank_from) in (({"node_rank": 0}, (0, None)), ({"node_rank": 4095}, (4095, None)),
                                              ({"node_rank": "%n"}, (7, None)),
                                              ({"node_rank_from": ("PMI_RANK",)}, (None, "PMI_RANK"))):
        for token in ("-", "announce", token_from_env("XRUN_TOKEN")):
            argv = list(connect_argv(PY, connect=ENDPOINT.connect, token=token, fingerprint=FINGERPRINT, **rank)[4:])
            argv = [a.replace("%n", "7") for a in argv]
            assert parse_args(argv) == AgentArgs(ENDPOINT.connect, node_rank, node_rank_from, FINGERPRINT, token)


def test_a_bad_command_line_still_gets_argparses_words():
    with pytest.raises(UsageError, match="--node_rank"):
        parse_args(["--connect=h:1", "--node_rank=x"])
    with pytest.raises(UsageError, match="not allowed with argument"):
        parse_args(["--connect=h:1", "--node_rank=1", "--node_rank_from=PMI_RANK"])


def test_a_malformed_head_name_is_a_channel_error_not_a_traceback():
    with pytest.raises(ChannelError, match="cannot reach the runner at a..b:1"):
        connect(Server("a..b", 1, timeout=0.2), Credentials(b"k" * 32, "0" * 64), node_rank=0)


def test_connect_argv_needs_exactly_one_rank_option():
    with pytest.raises(ValueError, match="exactly one"):
        connect_argv(PY, connect=None, token="-", fingerprint=None)
    with pytest.raises(ValueError, match="exactly one"):
        connect_argv(PY, connect=None, token="-", fingerprint=None, node_rank=0, node_rank_from=("PMI_RANK",))


def test_dry_run_placeholders_and_notes():
    plan = plan_for("pdsh")
    invocation = get_backend("pdsh").render(plan)
    assert [render(c.argv) for c in invocation.commands][1] == (
        "/opt/py/bin/python3 -u -m xrun.launch --connect=HEAD_ADDR:PORT --fingerprint=CERT_SHA256 --node_rank=1 --token=announce"
    )
    assert invocation.note == (
        "started as: PDSH_SSH_ARGS_APPEND='-o BatchMode=yes' pdsh -S -R ssh -f 1024 -N -w node1,node2,node3 "
        "'/opt/py/bin/python3 -u -m xrun.launch --connect=HEAD_ADDR:PORT --fingerprint=CERT_SHA256 --node_rank=%n --token=announce'"
    )
    ssh = get_backend("ssh").render(plan_for("ssh"))
    assert render(ssh.commands[2].argv) == (
        "/opt/py/bin/python3 -u -m xrun.launch --connect=HEAD_ADDR:PORT --fingerprint=CERT_SHA256 --node_rank=2 --token=-"
    )


def test_channel_backends_leave_the_master_to_the_start_barrier():
    plan = plan_for("ssh")
    assert plan.rendezvous.master_addr is None and "MASTER_ADDR" not in plan.nodes[2].ranks[0].env
    assert plan.shown_master_addr == "<node1 address>"
    assert plan_for("ssh", master_addr="10.1.2.3").nodes[2].ranks[0].env["MASTER_ADDR"] == "10.1.2.3"
    assert plan_for("no_ssh").rendezvous.master_addr == "node1"


def test_remote_specs_carry_env_and_cwd_but_no_argv_secret():
    plan = plan_for("ssh", env={"SECRET": "v$a'l\nue"}, cwd="/work dir")
    node = plan.nodes[1]
    assert node.env == {"SECRET": "v$a'l\nue"} and node.cwd == "/work dir"
    invocation = get_backend("ssh").render(plan)
    assert all("v$a" not in word for c in invocation.commands for word in c.argv)


@pytest.mark.parametrize("python", ["/opt/my python/bin/python3", "/p/it's", "/p/$(id)/py", "/p/ünï\ncødé"])
def test_weird_interpreter_paths_round_trip(python):
    plan = plan_for("pdsh", launch=LaunchOptions(python=python))
    remote = shlex.split(pdsh_argv(plan, ENDPOINT)[-1])
    assert remote[0] == python and remote[-2] == "--node_rank=%n"
    for command in ssh_commands(plan, {h: ENDPOINT for h in WORLD}):
        assert shlex.split(render(command.argv)) == list(command.argv)


def test_render_round_trips_weird(weird_args):
    assert shlex.split(render(weird_args)) == list(weird_args)


def test_dry_run_of_example_hostfile_needs_no_network():
    from tests.conftest import run_xrun

    result = run_xrun("--dry-run=json", "-H", "hostfiles/two-workers", "-i", "worker-1:0", "train.py")
    assert result.returncode == 0, result.stderr
    import json

    data = json.loads(result.stdout)
    assert data["backend"] in ("pdsh", "ssh") and data["master_addr"] == "<worker-1 address>"
    assert data["nodes"][0]["command"][3:] == ["xrun.launch", "--connect=HEAD_ADDR:PORT", "--fingerprint=CERT_SHA256",
                                               "--node_rank=0",
                                               "--token=announce" if data["backend"] == "pdsh" else "--token=-"]


def test_missing_pdsh_is_one_line_with_the_fix(monkeypatch):
    import xrun.runner.backends.pdsh as pdsh_module
    from xrun.errors import UsageError

    monkeypatch.setattr(pdsh_module.shutil, "which", lambda name: None)
    plan = plan_for("pdsh")
    with pytest.raises(UsageError, match="apt-get install pdsh, or use --launcher ssh"):
        get_backend("pdsh").execute(plan, IN_PROCESS)


def test_missing_paramiko_is_one_line_with_the_fix(monkeypatch):
    import builtins

    from xrun.errors import UsageError
    from xrun.runner import ssh_connections as sshconn
    real_import = builtins.__import__

    def no_paramiko(name, *args, **kwargs):
        if name == "paramiko":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_paramiko)
    with pytest.raises(UsageError, match=r"pip install 'xrun\[ssh\]'"):
        sshconn.import_paramiko()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--node_rank", "1", "t.py"], "--node_rank: only applies with --no_ssh"),
        (["--no_ssh", "--launcher", "ssh", "t.py"], "--no_ssh: cannot be combined with --launcher"),
        (["-H", "hostfiles/two-workers", "--no_ssh", "t.py"], "--no_ssh: needs --node_rank K"),
        (["-H", "hostfiles/two-workers", "--no_ssh", "--node_rank", "1", "--master_port", "0", "t.py"],
         "--master_port: 0 (a random port) cannot work with --no_ssh"),
        (["-H", "hostfiles/two-workers", "--export", "HOME=/x", "t.py"], "--export: HOME never travels"),
        (["-H", "hostfiles/two-workers", "--export", "NOT_SET_ANYWHERE_X", "t.py"],
         "--export: NOT_SET_ANYWHERE_X is not set"),
    ],
)
def test_remote_flag_errors_are_one_line(args, message):
    from tests.conftest import run_xrun

    result = run_xrun("--dry-run", *args)
    assert result.returncode == 2 and result.stderr == f"xrun: {message}" + result.stderr[len(message) + 6 :]
    assert result.stderr.count("\n") == 1


def test_no_ssh_dry_run_shows_this_nodes_agent():
    from tests.conftest import run_xrun

    result = run_xrun("--dry-run", "-H", "hostfiles/two-workers", "--no_ssh", "--node_rank", "1", "t.py")
    assert result.returncode == 0, result.stderr
    assert "backend no_ssh" in result.stdout and "master worker-0:29500" in result.stdout
    assert "--node_rank=1" in result.stdout


def test_pdsh_fanout_below_the_hosts_is_refused():
    """Agents hold their ssh connection for the whole job: pdsh -f 2 on 3 hosts would never start the third."""
    with pytest.raises(UsageError, match=r"--fanout: 2 is below the job's 3 hosts: .* use --fanout 3 or more"):
        pdsh_argv(plan_for("pdsh", remote=RemoteOptions(fanout=2)), ENDPOINT)
    assert pdsh_argv(plan_for("pdsh", remote=RemoteOptions(fanout=3)), ENDPOINT)[5] == "3"


def _fake_pdsh(*hosts):
    """A process standing in for pdsh: one child per host, ``python -c SLEEP HOST`` as its ssh client would be."""
    sleeper = "import time; time.sleep(30)"
    children = " & ".join(f"{shlex.quote(sys.executable)} -c {shlex.quote(sleeper)} {host}" for host in hosts)
    proc = subprocess.Popen(["sh", "-c", f"{children} & wait"])
    deadline = time.monotonic() + 10
    # Counting children is not enough: a forked child is still `sh` until its exec, and only then does its argv
    # carry the host (seen once in CI under load). Wait until every host is a word of some child's argv.
    while not all(any(host in argv for argv in _argvs_of_children(proc)) for host in hosts):
        assert time.monotonic() < deadline, "the fake ssh clients did not start"
        time.sleep(0.01)
    return proc


def _argvs_of_children(proc):
    argvs = []
    for child in psutil.Process(proc.pid).children():
        try:
            argvs.append(child.cmdline())
        except psutil.Error:  # a child between fork and exec may vanish from view for a moment
            continue
    return argvs


def test_pdsh_is_finished_once_it_waits_only_for_lost_nodes():
    session = PdshSession(_fake_pdsh("node2", "node3"), LaunchedHosts(["node2", "node3"], SshSettings()))
    try:
        assert not session.finished(set())  # every node's session is open: the job is not over for pdsh
        assert not session.finished({"node3"})  # node2's ssh still carries its last lines
        assert session.finished({"node2", "node3"})  # both lost (cut off, frozen): nothing left to wait for
    finally:
        session.terminate()
    assert session.proc.poll() is not None and session.finished(set())
