"""Pod mode's planning: request + detection -> pool and request (pure, tables), the CLI's dry run, PodSetup."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, run_xrun
from xrun.errors import XrunError
from xrun.launch.ranks.processes import rank_environment
from xrun.runner.cli import parse_request
from xrun.runner.hosts.smallfile import SmallFileError
from xrun.runner.planner import plan_job
from xrun.runner.pod.digest import make_digest
from xrun.runner.pod.placement import NodeIO, Placement, PodSetup, control_port, place, pod_setup

PAI = {"MASTER_ADDR": "dlc1-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "1"}
KUBEFLOW = {"PET_NNODES": "4", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456",
            "PET_NPROC_PER_NODE": "8", "WORLD_SIZE": "32", "RANK": "2", "MASTER_ADDR": "job-master-0"}
INDEXED = {"JOB_COMPLETION_INDEX": "2"}


def no_files(path):
    raise SmallFileError(path, "no such file", missing=True)


def fake_io(local=(0, 1), hostfiles=None, files=None):
    def read(path):
        if files and path in files:
            return files[path]
        return no_files(path)

    return NodeIO(read_file=read, local_pool=lambda: {"localhost": tuple(local)},
                  hostfile_pool=lambda path: dict((hostfiles or {})[path]))


def placed(argv, env, io=None) -> Placement:
    request, _ = parse_request([*argv, "train.py"])
    return place(request, env, io or fake_io())


def summary(placement: Placement):
    request = placement.request
    return (request.remote.no_ssh, request.remote.node_rank, placement.pool, request.master_addr,
            request.master_port, request.run_id)


NUMBERED3 = {"node0": (0, 1), "node1": (0, 1), "node2": (0, 1)}
TRAIN4 = {f"train-{k}.train": (0, 1) for k in range(4)}


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        # PAI-DLC / older PyTorchJob: WORLD_SIZE pods, each with this node's slots, numbered.
        ([], PAI, (True, 1, NUMBERED3, "dlc1-master-0", 23456, "xrun-dlc1-master-0-23456")),
        # Kubeflow: PET_* win over WORLD_SIZE (processes); PET_NPROC_PER_NODE gives the slots.
        ([], KUBEFLOW, (True, 2, {f"node{k}": tuple(range(8)) for k in range(4)}, "job-master-0", 23456,
                        "xrun-job-master-0-23456")),
        # Flags override everything detected.
        (["--num_nodes", "2", "--node_rank", "0", "--master_addr", "m", "--master_port", "1234", "--run_id", "j"], PAI,
         (True, 0, {"node0": (0, 1), "node1": (0, 1)}, "m", 1234, "j")),
        (["--num_gpus", "1"], KUBEFLOW, (True, 2, {f"node{k}": (0,) for k in range(4)}, "job-master-0", 23456,
                                         "xrun-job-master-0-23456")),
        # Indexed Job: the index, and the hosts from --hosts; the master is the first host.
        (["--hosts", "train-[0-3].train"], INDEXED, (True, 2, TRAIN4, None, 29500, "xrun-train-0.train-29500")),
        (["--num_nodes", "3", "--master_addr", "head"], INDEXED, (True, 2, NUMBERED3, "head", 29500,
                                                                  "xrun-head-29500")),
        # By hand: --no_ssh and --pod, with a hostfile; the run id is one every node computes alike.
        (["-H", "hf", "--no_ssh", "--node_rank", "1"], {}, (True, 1, {"a": (0,), "b": (0,)}, None, 29500,
                                                            "xrun-a-29500")),
        (["-H", "hf", "--pod", "--node_rank", "0"], {}, (True, 0, {"a": (0,), "b": (0,)}, None, 29500, "xrun-a-29500")),
        (["--pod", "--node_rank", "0"], {}, (True, 0, {"localhost": (0, 1)}, None, 29500, "xrun-localhost-29500")),
        # -H wins over the numbered nodes; its size must match the platform's count.
        (["-H", "hf3"], PAI, (True, 1, {"a": (0,), "b": (0,), "c": (0,)}, "dlc1-master-0", 23456,
                              "xrun-dlc1-master-0-23456")),
    ],
)
def test_pod_placement(argv, env, expected):
    io = fake_io(hostfiles={"hf": {"a": (0,), "b": (0,)}, "hf3": {"a": (0,), "b": (0,), "c": (0,)}})
    assert summary(placed(argv, env, io)) == expected


def test_head_mode_pools():
    # Nothing detected, nothing named: the CLI's own lookup (hostfile, Slurm, this machine).
    nothing = placed([], {})
    assert nothing.pool is None and nothing.announcement is None and not nothing.request.remote.no_ssh
    hosts = placed(["--hosts", "w[1-2]", "--num_gpus", "4"], {})
    assert hosts.pool == {"w1": (0, 1, 2, 3), "w2": (0, 1, 2, 3)} and not hosts.request.remote.no_ssh
    assert placed(["--hosts", "w[1-2]"], {}, fake_io(local=(0, 1, 2))).pool == {"w1": (0, 1, 2), "w2": (0, 1, 2)}


def test_pbs_allocation_is_the_pool():
    env = {"PBS_JOBID": "42.pbs", "PBS_NODEFILE": "/var/spool/pbs/aux/42.pbs"}
    found = placed([], env, fake_io(files={"/var/spool/pbs/aux/42.pbs": "n2\nn2\nn1\n"}))
    assert found.pool == {"n2": (0, 1), "n1": (0,)} and not found.request.remote.no_ssh
    assert found.request.pod.hosts == "n2,n1"  # the backend choice sees a named host list
    assert found.announcement == ("xrun: using PBS job 42.pbs: 2 node(s), 3 slot(s) from "
                                  "PBS_NODEFILE=/var/spool/pbs/aux/42.pbs")
    # A hostfile, --launcher local, or starting every node by hand: the allocation is not read.
    for argv in (["-H", "x"], ["--launcher", "local"], ["--pod", "--node_rank", "0"]):
        assert placed(argv, env, fake_io(hostfiles={"x": {"a": (0,)}})).request.pod.detected is None


def test_announcement_names_overriding_flags():
    line = placed(["--node_rank", "0", "--num_nodes", "2", "--master_port", "2"], PAI).announcement
    assert line.endswith("; overridden by --node_rank, --num_nodes, --master_port")
    assert placed([], PAI).announcement.count("\n") == 0
    assert placed(["--platform", "none"], PAI).announcement is None


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--node_rank", "1"], {}, "--node_rank: only applies with --no_ssh or --pod"),
        (["--platform", "none", "--node_rank", "1"], PAI, "--node_rank: only applies with --no_ssh or --pod"),
        (["--control_port", "5"], {}, "--control_port: only applies in pod mode"),
        (["--token_file", "/t"], {}, "--token_file: only applies in pod mode"),
        (["--pod", "--launcher", "ssh"], {}, "--pod: cannot be combined with --launcher"),
        (["--pod"], {}, "--pod: needs --node_rank K"),
        (["--no_ssh"], {}, "--no_ssh: needs --node_rank K"),
        ([], INDEXED, "--hosts: JOB_COMPLETION_INDEX gives this node's index only"),
        (["--num_nodes", "3"], INDEXED, "--master_addr: needed: --num_nodes gives a node count but no host names"),
        ([], {"PET_NNODES": "2", "MASTER_ADDR": "m"}, "--node_rank: Kubeflow (PET_NNODES) gives no node rank"),
        ([], {"WORLD_SIZE": "2", "RANK": "1"}, "--master_addr: needed: WORLD_SIZE, RANK gives a node count"),
        (["-H", "hf"], PAI, "-H: lists 2 host(s) but PyTorchJob-style variables (WORLD_SIZE, RANK) says 3 node(s)"),
        (["--num_nodes", "1"], PAI, "--node_rank: 1 (from WORLD_SIZE, RANK) is outside 0..0 for a 1-node world"),
        (["--hosts", "a,a"], INDEXED, "--hosts: 'a,a' names a host twice"),
        (["--hosts", "a[1-"], INDEXED, "--hosts: unclosed '['"),
        (["--hosts", "n[0-99999999]"], INDEXED, "--hosts: 'n[0-99999999]' names 100000000 hosts"),
        (["--hosts", "a_b:c"], {}, "--hosts: 'a_b:c': 'a_b:c' is not a host name"),
        (["--num_gpus", "0", "--hosts", "a"], {}, "--num_gpus '0': must be in 1..1024"),
        (["--num_nodes", "0"], PAI, "--num_nodes '0': must be in 1..65536"),
        ([], dict(PAI, MASTER_PORT="1"), "--control_port: the default, --master_port - 1, is 0"),
        (["--control_port", "23456"], PAI, "--control_port: 23456 is the master port too"),
        ([], dict(PAI, RANK="x"), "RANK='x': a node rank must be a whole number"),
    ],
)
def test_placement_errors_are_one_line(argv, env, message):
    io = fake_io(hostfiles={"hf": {"a": (0,), "b": (0,)}})
    with pytest.raises(XrunError) as err:
        placed(argv, env, io)
    assert str(err.value).startswith(message), str(err.value)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


FLAGS = st.lists(st.sampled_from([
    ["--pod"], ["--no_ssh"], ["--node_rank", "0"], ["--node_rank", "5"], ["--num_nodes", "2"], ["--num_gpus", "2"],
    ["--master_addr", "m"], ["--master_port", "1"], ["--platform", "none"], ["--hosts", "h[0-2]"], ["-H", "hf"],
    ["--control_port", "29500"], ["--launcher", "local"], ["--launcher", "ssh"], ["--run_id", "r"],
    ["-i", "node0"],
]), max_size=5)
ENV_NAMES = ["PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT",
             "WORLD_SIZE", "RANK", "JOB_COMPLETION_INDEX", "VC_TASK_INDEX", "VC_WORKER_HOSTS", "PBS_JOBID",
             "PBS_NODEFILE", "LSB_JOBID", "LSB_MCPU_HOSTS", "LWS_GROUP_SIZE", "SKYPILOT_NODE_IPS"]
ENV_VALUES = st.sampled_from(["0", "1", "2", "3", "70000", "2:4", "auto", "m", "a,b", "h 2", "", "x", "/nf"])


@settings(max_examples=300, deadline=None)
@given(FLAGS, st.dictionaries(st.sampled_from(ENV_NAMES), ENV_VALUES, max_size=6))
def test_any_flags_and_environment_place_or_fail_in_one_line(flags, env):
    io = fake_io(hostfiles={"hf": {"a": (0,), "b": (0,)}}, files={"/nf": "n1\nn1\nn2\n"})
    try:
        result = placed([arg for flag in flags for arg in flag], env, io)
    except XrunError as err:
        assert err.exit_code == 2 and "\n" not in str(err)
        return
    request = result.request
    if request.remote.no_ssh:
        assert request.remote.node_rank is not None and result.pool
        assert 1 <= control_port(request) <= 65535 or request.master_port == 0
    if result.announcement is not None:
        assert "\n" not in result.announcement


# ---------------------------------------------------------------------------------------------------------------
# Through the planner: the plan, the ranks' env contract, PodSetup.


def plan_in(monkeypatch, env, argv):
    for name in {"CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", *ENV_NAMES, *KUBEFLOW}:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return plan_job(parse_request([*argv, "train.py", "--lr", "1"])[0])


def test_ranks_get_xruns_contract_not_the_platforms(monkeypatch):
    plan = plan_in(monkeypatch, PAI, ["--num_gpus", "2"])
    assert plan.backend == "no_ssh" and plan.world_size == 6
    node = plan.nodes[1]
    platform_env = {**os.environ}  # what the pod has: RANK=1, WORLD_SIZE=3 describe pods
    envs = [rank_environment(platform_env, node, rank) for rank in node.ranks]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["GROUP_RANK"]) for e in envs] == [
        ("2", "0", "6", "1"), ("3", "1", "6", "1")]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("dlc1-master-0", "23456")}


def test_pod_setup(monkeypatch):
    plan = plan_in(monkeypatch, KUBEFLOW, [])
    setup = pod_setup(plan, token="s3cr3t")
    assert (setup.node_rank, setup.num_nodes, setup.master_addr, setup.master_port, setup.control_addr,
            setup.control_port) == (2, 4, "job-master-0", 23456, "job-master-0", 23455)
    assert dict(setup.world) == {f"node{k}": tuple(range(8)) for k in range(4)}
    assert "s3cr3t" not in repr(setup)
    other = pod_setup(plan_in(monkeypatch, dict(KUBEFLOW, PET_NODE_RANK="0"), []), token=None)
    assert other.digest == setup.digest  # the node's own rank is not in the digest
    assert pod_setup(plan_in(monkeypatch, KUBEFLOW, ["--control_port", "4000"]), token=None).control_port == 4000
    with pytest.raises(XrunError, match="not a pod-mode plan"):
        pod_setup(plan_in(monkeypatch, {}, []), token=None)


def test_token_never_in_repr():
    setup = PodSetup(node_rank=0, num_nodes=1, world={"a": (0,)}, master_addr="a", master_port=1, control_addr="a",
                     control_port=2, digest=make_digest({}), token="s3cr3t")
    assert "s3cr3t" not in repr(setup) and setup.token == "s3cr3t"


def test_hosts_flag_fans_out_like_a_hostfile(monkeypatch):
    plan = plan_in(monkeypatch, {}, ["--hosts", "w[1-2]", "--num_gpus", "2"])
    assert plan.backend in ("pdsh", "ssh") and list(plan.world) == ["w1", "w2"]
    assert plan_in(monkeypatch, {}, ["--hosts", "localhost", "--num_gpus", "1"]).backend == "local"


def test_hosts_flag_inside_slurm_is_not_the_allocation(monkeypatch):
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "s[1-2]"}
    assert plan_in(monkeypatch, env, ["--hosts", "w[1-2]", "--num_gpus", "1"]).backend in ("pdsh", "ssh")


def test_pbs_job_fans_out(monkeypatch, tmp_path, capsys):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n1\nn1\nn2\nn2\n")
    plan = plan_in(monkeypatch, {"PBS_JOBID": "9", "PBS_NODEFILE": str(nodefile)}, [])
    assert plan.backend in ("pdsh", "ssh") and dict(plan.world) == {"n1": (0, 1), "n2": (0, 1)}
    assert capsys.readouterr().err == f"xrun: using PBS job 9: 2 node(s), 4 slot(s) from PBS_NODEFILE={nodefile}\n"


# ---------------------------------------------------------------------------------------------------------------
# The command line as a pod runs it.


def test_dry_run_json_on_a_pytorchjob_pod():
    result = run_xrun("--dry-run=json", "--num_gpus", "2", "train.py", env=PAI)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("xrun: PyTorchJob-style variables")
    data = json.loads(result.stdout)
    assert (data["backend"], data["world_size"], data["master_addr"], data["master_port"]) == (
        "no_ssh", 6, "dlc1-master-0", 23456)
    assert data["platform"]["name"] == "pytorchjob" and data["platform"]["node_rank"] == 1
    assert data["pod"]["node_rank"] == 1 and data["pod"]["control_port"] == 23455 and len(data["pod"]["digest"]) == 64
    node = data["nodes"][1]
    assert node["command"] is not None and "--node_rank=1" in node["command"]
    assert [r["env"]["RANK"] for r in node["ranks"]] == ["2", "3"]  # xrun's ranks, not the platform's RANK=1


def test_dry_run_text_shows_the_platform():
    result = run_xrun("--dry-run", "--num_gpus", "1", "train.py", env=KUBEFLOW)
    assert result.returncode == 0, result.stderr
    assert "platform: Kubeflow (PET_NNODES, PET_NODE_RANK): node 2 of 4, master job-master-0:23456" in result.stdout
    assert "pod: node 2 of 4, control job-master-0:23455, plan digest " in result.stdout
    assert result.stderr.startswith("xrun: Kubeflow") and result.stderr.count("\n") == 1


def test_dry_run_without_a_platform():
    result = run_xrun("--dry-run=json", "train.py")
    assert result.returncode == 0 and result.stderr == ""
    data = json.loads(result.stdout)
    assert data["platform"] is None and data["pod"] is None


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        (dict(PAI, RANK="abc"), [], "xrun: RANK='abc': a node rank must be a whole number"),
        (dict(PAI, RANK="3"), [], "xrun: RANK='3': is not below WORLD_SIZE=3"),
        ({"WORLD_SIZE": "2", "RANK": "1"}, [], "xrun: --master_addr: needed"),
        (INDEXED, [], "xrun: --hosts: JOB_COMPLETION_INDEX gives this node's index only"),
        ({}, ["--platform", "kubernetes"], "xrun: argument --platform: invalid choice: 'kubernetes'"),
        ({}, ["--control_port", "0"], "xrun: --control_port: 0 is not a TCP port"),
        ({}, ["-H", "hostfiles/two-workers", "--hosts", "a"], "xrun: --hosts: cannot be combined with -H"),
    ],
)
def test_bad_pod_input_is_one_line_exit_2(env, args, message):
    result = run_xrun("--dry-run", *args, "train.py", env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(message), result.stderr
    assert result.stderr.count("\n") == 1


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_a_detected_pod_runs_like_no_ssh(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import os\nprint('env', *(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'GROUP_RANK')))\n")
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "1", "RANK": "0"}
    result = run_xrun("--num_gpus", "2", "--no_local_rank", "--python", sys.executable, str(script), env=env,
                      cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert sorted(line.split("env ")[1] for line in result.stdout.splitlines() if "env " in line) == [
        "0 2 0", "1 2 0"]
    assert result.stderr.startswith("xrun: PyTorchJob-style variables (WORLD_SIZE, RANK): node 0 of 1")
