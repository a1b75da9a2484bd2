"""Golden tests: the exact command every MPI/Slurm backend runs for a fixed plan (whole strings), plus the
CLI wiring of --launcher_args and Slurm allocation discovery. Nothing here starts an engine."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from tests.conftest import run_xrun
from xrun.common.rankplan import LaunchOptions
from xrun.errors import UsageError
from xrun.runner.backends import known_backends
from xrun.runner.backends.base import get_backend
from xrun.runner.backends.channel import Endpoint
from xrun.runner.backends.engine import TOKEN_ENV, agent_argv
from xrun.runner.backends.impi import IntelMpiBackend
from xrun.runner.backends.mpich import MpichBackend
from xrun.runner.backends.mvapich import MvapichBackend
from xrun.runner.backends.openmpi import OpenMpiBackend
from xrun.runner.backends.slurm import SlurmBackend
from xrun.runner.cli import parse_request
from xrun.runner.plan import JobRequest, make_plan
from xrun.runner.planner import plan_job
from xrun.runner.remote_options import RemoteOptions
from xrun.shell import render

PY = "/opt/py/bin/python3"
WORLD = {"node1": (0, 1), "node3": (0, 1), "node2": (0,)}  # not sorted: the engines must keep this order
ENDPOINT = Endpoint("10.77.0.1", 40123, "f00d", "abababababababababababababababababababababababababababababababab")
AGENT = "/opt/py/bin/python3 -u -m xrun.launch --connect=10.77.0.1:40123 --fingerprint=abababababababababababababababababababababababababababababababab"


def nothing_installed(name):
    return None


def plan_for(backend, launcher_args=(), **request):
    request.setdefault("launch", LaunchOptions(python=PY))
    remote = RemoteOptions(launcher_args=tuple(launcher_args))
    return make_plan(JobRequest(script="train.py", args=("--lr", "3e-4"), run_id="r1", remote=remote, **request),
                     WORLD, backend)


def test_registry_lists_every_engine():
    assert {"openmpi", "mpich", "impi", "mvapich", "slurm"} <= set(known_backends())
    with pytest.raises(UsageError, match="unknown backend 'mpi'; known: .*mpich.*openmpi.*slurm"):
        get_backend("mpi")


def test_openmpi_golden():
    argv = OpenMpiBackend(which=nothing_installed).engine_argv(plan_for("openmpi"), ENDPOINT)
    assert render(argv) == (
        "mpirun -np 3 --host node1,node3,node2 --map-by ppr:1:node --bind-to none -x XRUN_TOKEN "
        f"{AGENT} --node_rank_from=OMPI_COMM_WORLD_RANK,PMIX_RANK --token=env:XRUN_TOKEN"
    )


def test_openmpi_prefers_the_unambiguous_name():
    backend = OpenMpiBackend(which=lambda name: f"/usr/bin/{name}")
    assert backend.engine_argv(plan_for("openmpi"), ENDPOINT)[0] == "mpirun.openmpi"


def test_mpich_golden():
    argv = MpichBackend(which=nothing_installed).engine_argv(plan_for("mpich"), ENDPOINT)
    assert render(argv) == (
        "mpiexec.hydra -hosts node1,node3,node2 -ppn 1 -n 3 -genvlist XRUN_TOKEN "
        f"{AGENT} --node_rank_from=PMI_RANK,PMIX_RANK --token=env:XRUN_TOKEN"
    )


def test_impi_golden():
    argv = IntelMpiBackend(which=nothing_installed).engine_argv(plan_for("impi"), ENDPOINT)
    assert render(argv) == (
        "mpiexec.hydra -hosts node1,node3,node2 -ppn 1 -n 3 -genvlist XRUN_TOKEN "
        f"{AGENT} --node_rank_from=PMI_RANK,PMIX_RANK --token=env:XRUN_TOKEN"
    )


def test_mvapich_golden():
    # MVAPICH is not installable here: this rendered command is all that is tested of it.
    argv = MvapichBackend(which=nothing_installed).engine_argv(plan_for("mvapich"), ENDPOINT)
    assert render(argv) == (
        "mpirun -hosts node1,node3,node2 -ppn 1 -n 3 -genvlist XRUN_TOKEN "
        f"{AGENT} --node_rank_from=MV2_COMM_WORLD_RANK,PMI_RANK --token=env:XRUN_TOKEN"
    )


def test_slurm_golden_inside_an_allocation():
    backend = SlurmBackend(which=nothing_installed, environ={"SLURM_JOB_ID": "42"})
    assert render(backend.engine_argv(plan_for("slurm"), ENDPOINT)) == (
        "srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --nodelist=node1,node3,node2 --distribution=arbitrary "
        "--kill-on-bad-exit=1 --cpu-bind=none --export=ALL --job-name=r1 "
        f"{AGENT} --node_rank_from=SLURM_PROCID --token=env:XRUN_TOKEN"
    )


def test_slurm_golden_outside_an_allocation_asks_for_whole_nodes():
    backend = SlurmBackend(which=nothing_installed, environ={})
    assert render(backend.engine_argv(plan_for("slurm"), ENDPOINT)) == (
        "srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --nodelist=node1,node3,node2 --distribution=arbitrary "
        "--kill-on-bad-exit=1 --cpu-bind=none --export=ALL --job-name=r1 --exclusive "
        f"{AGENT} --node_rank_from=SLURM_PROCID --token=env:XRUN_TOKEN"
    )


def test_slurm_starts_srun_without_the_names_that_never_travel():
    # srun --export=ALL hands its whole environment to every agent and so to every rank: the head's session
    # (HOME, SSH_*, exported shell functions) stays behind, as on every other backend; the rest still goes.
    head = {"SLURM_JOB_ID": "42", "HOME": "/home/head", "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1", "PWD": "/w",
            "BASH_FUNC_ls%%": "() { evil; }", "PATH": "/usr/bin", "NCCL_DEBUG": "INFO", "XRUN_TOKEN": "stale"}
    backend = SlurmBackend(which=nothing_installed, environ=head)
    assert backend.render(plan_for("slurm")).note == (
        "started as: env -u BASH_FUNC_ls%% -u HOME -u PWD -u SSH_AUTH_SOCK XRUN_TOKEN=<token> srun --nodes=3 "
        "--ntasks=3 --ntasks-per-node=1 --nodelist=node1,node3,node2 --distribution=arbitrary --kill-on-bad-exit=1 "
        "--cpu-bind=none --export=ALL --job-name=r1 /opt/py/bin/python3 -u -m xrun.launch --connect=HEAD_ADDR:PORT --fingerprint=CERT_SHA256 "
        "--node_rank_from=SLURM_PROCID --token=env:XRUN_TOKEN"
    )
    env = backend.engine_env("run-token")
    assert env == {"XRUN_TOKEN": "run-token", "SLURM_JOB_ID": "42", "PATH": "/usr/bin", "NCCL_DEBUG": "INFO"}
    assert list(env)[0] == "XRUN_TOKEN"  # first, for hydra's sake (engine.py)


def test_mpi_engines_export_by_name_and_keep_their_own_environment():
    backend = OpenMpiBackend(which=nothing_installed, environ={"HOME": "/home/head", "PATH": "/usr/bin"})
    assert backend.engine_env("t") == {"XRUN_TOKEN": "t", "HOME": "/home/head", "PATH": "/usr/bin"}
    assert backend.render(plan_for("openmpi")).note.startswith("started as: XRUN_TOKEN=<token> mpirun ")


def test_an_engines_agent_without_home_gets_the_logins():
    import pwd

    from xrun.launch.engine_env import restore_home

    environ = {"PATH": "/usr/bin"}
    restore_home(environ)
    assert environ == {"PATH": "/usr/bin", "HOME": pwd.getpwuid(os.getuid()).pw_dir}
    environ = {"HOME": "/given"}
    restore_home(environ)
    assert environ == {"HOME": "/given"}


WEIRD_LAUNCHER_ARGS = "--mca btl_tcp_if_include 'eth 1' -x 'A=\"q\"'"


@pytest.mark.parametrize(
    ("backend", "head"),
    [
        (OpenMpiBackend, "mpirun -np 3 --host node1,node3,node2 --map-by ppr:1:node --bind-to none -x XRUN_TOKEN "),
        (MpichBackend, "mpiexec.hydra -hosts node1,node3,node2 -ppn 1 -n 3 -genvlist XRUN_TOKEN "),
    ],
)
def test_launcher_args_go_between_engine_flags_and_agent(backend, head):
    args = tuple(shlex.split(WEIRD_LAUNCHER_ARGS))
    argv = backend(which=nothing_installed).engine_argv(plan_for(backend.name, args), ENDPOINT)
    assert render(argv).startswith(head + "--mca btl_tcp_if_include 'eth 1' -x 'A=\"q\"' " + AGENT)
    assert argv[argv.index("-x", argv.index("--mca")) + 1] == 'A="q"'


def test_agent_argv_is_the_same_on_every_node_and_carries_no_secret():
    invocation = OpenMpiBackend(which=nothing_installed).render(plan_for("openmpi"))
    argvs = {c.argv for c in invocation.commands}
    assert argvs == {agent_argv(PY, None, ("OMPI_COMM_WORLD_RANK", "PMIX_RANK"))}
    assert [c.host for c in invocation.commands] == ["node1", "node3", "node2"]
    assert render(next(iter(argvs))) == (
        "/opt/py/bin/python3 -u -m xrun.launch --connect=HEAD_ADDR:PORT --fingerprint=CERT_SHA256 "
        "--node_rank_from=OMPI_COMM_WORLD_RANK,PMIX_RANK --token=env:XRUN_TOKEN"
    )
    assert invocation.note == (
        "started as: XRUN_TOKEN=<token> mpirun -np 3 --host node1,node3,node2 --map-by ppr:1:node --bind-to none "
        "-x XRUN_TOKEN /opt/py/bin/python3 -u -m xrun.launch --connect=HEAD_ADDR:PORT --fingerprint=CERT_SHA256 "
        "--node_rank_from=OMPI_COMM_WORLD_RANK,PMIX_RANK --token=env:XRUN_TOKEN"
    )


def test_user_args_and_env_are_never_on_the_engine_command_line(weird_args):
    plan = make_plan(
        JobRequest(script="train.py", args=tuple(weird_args), run_id="r1", launch=LaunchOptions(python=PY),
                   env={"SECRET": "s3cr3t value"}),
        WORLD, "slurm",
    )
    argv = SlurmBackend(which=nothing_installed, environ={}).engine_argv(plan, ENDPOINT)
    assert "s3cr3t" not in render(argv) and "train.py" not in argv
    assert plan.nodes[1].env["SECRET"] == "s3cr3t value"  # it travels in the spec
    assert plan.nodes[1].ranks[0].argv[-len(weird_args):] == tuple(weird_args)


def test_engine_plans_leave_the_master_to_the_start_barrier():
    plan = plan_for("openmpi")
    assert "MASTER_ADDR" not in plan.nodes[2].ranks[0].env and plan.shown_master_addr == "<node1 address>"


# ---------------------------------------------------------------------------------------------------------------
# CLI: --launcher_args and the Slurm allocation


def test_launcher_args_are_shell_split():
    request, _ = parse_request(["--launcher", "openmpi", "--launcher_args", WEIRD_LAUNCHER_ARGS, "train.py"])
    assert request.remote.launcher_args == ("--mca", "btl_tcp_if_include", "eth 1", "-x", 'A="q"')


def test_launcher_args_bad_quoting():
    with pytest.raises(UsageError, match="--launcher_args: .*No closing quotation"):
        parse_request(["--launcher_args", "'open", "train.py"])


def test_launcher_args_rejected_for_ssh(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb slots=1\n")
    request, _ = parse_request(["-H", str(hostfile), "--launcher", "ssh", "--launcher_args", "-x", "train.py"])
    expected = "--launcher_args: applies to impi, mpich, mvapich, openmpi, slurm, not to 'ssh'"
    with pytest.raises(UsageError, match=expected):
        plan_job(request)


ALLOCATION = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NODELIST": "gpu[07-08],cpu1",
    "SLURM_TASKS_PER_NODE": "2(x2),1",
}


@pytest.fixture
def in_allocation(monkeypatch):
    for name, value in ALLOCATION.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_no_hostfile_inside_an_allocation_uses_it(in_allocation, capsys):
    request, _ = parse_request(["--python", PY, "train.py"])
    plan = plan_job(request)
    assert plan.backend == "slurm"
    assert dict(plan.world) == {"gpu07": (0, 1), "gpu08": (0, 1), "cpu1": (0,)}
    assert "using Slurm allocation 77: 3 node(s), 5 slot(s) from SLURM_TASKS_PER_NODE" in capsys.readouterr().err


def test_filters_apply_to_the_allocation(in_allocation):
    request, _ = parse_request(["--exclude", "gpu08@gpu07:1", "train.py"])
    assert dict(plan_job(request).world) == {"gpu07": (0,), "cpu1": (0,)}
    request, _ = parse_request(["--include", "gpu08:1", "train.py"])
    assert dict(plan_job(request).world) == {"gpu08": (1,)}


def test_allocation_with_another_engine_or_local(in_allocation):
    request, _ = parse_request(["--launcher", "openmpi", "train.py"])
    assert plan_job(request).backend == "openmpi"
    request, _ = parse_request(["--launcher", "local", "train.py"])
    plan = plan_job(request)
    assert plan.backend == "local" and list(plan.world) == ["localhost"]


def test_a_hostfile_wins_over_the_allocation(in_allocation, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb slots=1\n")
    request, _ = parse_request(["-H", str(hostfile), "train.py"])
    assert plan_job(request).backend != "slurm"


def test_dry_run_inside_an_allocation():
    env = dict(ALLOCATION, SLURM_JOB_NODELIST="node[1-2]", SLURM_TASKS_PER_NODE="2(x2)")
    proc = run_xrun("--dry-run=json", "--python", PY, "train.py", "a b", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["backend"] == "slurm" and data["world_size"] == 4
    assert [node["host"] for node in data["nodes"]] == ["node1", "node2"]
    assert data["nodes"][1]["command"] == [
        PY, "-u", "-m", "xrun.launch", "--connect=HEAD_ADDR:PORT", "--fingerprint=CERT_SHA256",
        "--node_rank_from=SLURM_PROCID",
        f"--token=env:{TOKEN_ENV}",
    ]
    assert "using Slurm allocation 77" in proc.stderr


def test_bad_allocation_variable_is_a_one_line_error():
    proc = run_xrun("--dry-run", "train.py", env={"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[1-"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("xrun: SLURM_JOB_NODELIST='n[1-': ")
