"""xrun.discover(): pure parts from literal environments, and real runs under mpirun / mpiexec.hydra (this
machine only; the cross-node runs are in tests/cluster)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from xrun.discovery import (
    Discovered,
    DiscoverError,
    EngineRanks,
    choose_master_addr,
    discover,
    engine_ranks,
    local_rank_among,
    make_mpich_shim,
    slurm_master,
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
             "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"},
            EngineRanks("openmpi", 3, 4, 1, 2, "openmpi"),
        ),
        (
            {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
            EngineRanks("hydra", 2, 4, 0, 2, "mpich"),
        ),
        (
            {"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_LOCAL_RANK": "1",
             "PMI_RANK": "1"},
            EngineRanks("mvapich", 1, 2, 1, None, "mpich"),
        ),
        ({"PMIX_RANK": "5"}, EngineRanks("pmix", 5, None, None, None, None)),
        (
            {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1",
             "SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
            EngineRanks("slurm", 3, 4, 1, 2, None),
        ),
    ],
)
def test_engine_ranks(env, expected):
    assert engine_ranks(env) == expected


def test_not_under_an_engine_is_a_clear_error():
    with pytest.raises(DiscoverError, match="not started by mpirun, mpiexec or srun: none of OMPI_COMM_WORLD_RANK"):
        engine_ranks({})


def test_a_batch_script_is_not_a_task():
    # sbatch sets SLURM_PROCID=0 in the batch script, which is no step task.
    with pytest.raises(DiscoverError, match="not started by"):
        engine_ranks({"SLURM_PROCID": "0", "SLURM_JOB_ID": "9"})


def test_bad_number_names_the_variable():
    with pytest.raises(DiscoverError, match="PMI_RANK='x' is not a non-negative integer"):
        engine_ranks({"PMI_RANK": "x"})


def test_slurm_master_is_the_first_node_and_a_job_port():
    env = {"SLURM_STEP_NODELIST": "gpu[07-09]", "SLURM_JOB_ID": "123456"}
    assert slurm_master(env) == ("gpu07", 20000 + 123456 % 20000)


def test_srun_alone_needs_no_mpi4py():
    env = {"SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "0",
           "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NODELIST": "n[1-2]",
           "SLURM_JOB_ID": "5"}
    found = discover(environ=env)
    assert found == Discovered(rank=1, local_rank=0, world_size=2, local_world_size=1, master_addr="n1",
                               master_port=20005, engine="slurm")
    assert env["RANK"] == "1" and env["MASTER_ADDR"] == "n1" and env["MASTER_PORT"] == "20005"


def test_user_master_wins_under_srun():
    env = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n1", "MASTER_ADDR": "10.0.0.9",
           "MASTER_PORT": "1234"}
    found = discover(environ=env, set_env=False)
    assert (found.master_addr, found.master_port) == ("10.0.0.9", 1234)
    assert "RANK" not in env


def test_local_rank_among():
    hosts = ["a", "b", "a", "b", "a"]
    assert [local_rank_among(hosts, r) for r in range(5)] == [(0, 3), (0, 2), (1, 3), (1, 2), (2, 3)]


def test_master_addr_choice():
    resolve = {"n1": "10.1.0.1", "n2": "10.1.0.2", "vm": "127.0.0.1"}.get
    route = {"10.1.0.2": "10.1.0.100"}.get
    assert choose_master_addr(["n1", "n1"], resolve, route) == "127.0.0.1"
    assert choose_master_addr(["n1", "n2"], resolve, route) == "n1"
    # rank 0's own name resolves to loopback: use the address of its route to a peer
    assert choose_master_addr(["vm", "n2"], resolve, route) == "10.1.0.100"
    assert choose_master_addr(["vm", "zz"], resolve, route) == "vm"


def test_mpich_shim(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libmpich.so.12").write_text("")
    link = make_mpich_shim(str(tmp_path / "shim"), search=(str(lib),))
    assert os.readlink(link) == str(lib / "libmpich.so.12")
    assert link.endswith("/libmpi.so.12")
    with pytest.raises(DiscoverError, match="libmpich.so.12 not found"):
        make_mpich_shim(str(tmp_path / "shim2"), search=(str(tmp_path / "none"),))
    (tmp_path / "afile").write_text("")
    with pytest.raises(DiscoverError, match="cannot make .*: Not a directory; name a directory you can write"):
        make_mpich_shim(str(tmp_path / "afile" / "shim"), search=(str(lib),))  # was a NotADirectoryError traceback


def test_cli_outside_mpi_says_so():
    proc = subprocess.run([sys.executable, "-m", "xrun.discovery", "x.py"], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_"))})
    assert proc.returncode == 2
    assert proc.stderr.startswith("xrun.discovery: not started by mpirun")


def test_cli_names_a_missing_script_in_one_line(tmp_path):
    # under an engine, runpy.run_path's FileNotFoundError was a traceback
    env = {**os.environ, "SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}  # srun's variables: no MPI library needed
    proc = subprocess.run([sys.executable, "-m", "xrun.discovery", "nope.py"], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=60)
    assert (proc.returncode, proc.stderr) == (2, f"xrun.discovery: SCRIPT 'nope.py': no such file in {tmp_path}\n")


# ---------------------------------------------------------------------------------------------------------------
# Real engines on this machine.

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import xrun
    found = xrun.discover()
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    record = json.dumps({k: os.environ[k] for k in keys} | {"argv": sys.argv[1:]})
    # a file per rank: the engines forward output in chunks, so lines of two ranks may interleave
    with open(os.path.join(os.environ["RESULTS"], os.environ["RANK"] + ".json"), "w") as f:
        f.write(record)
    """
)


def _need(*tools):
    missing = [t for t in tools if shutil.which(t) is None]
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        missing.append("mpi4py")
    if missing:
        reason = f"needs {', '.join(missing)} (.ci/cluster-deps.sh, pip install mpi4py)"
        if os.environ.get("XRUN_REQUIRE_CLUSTER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def _run(argv, tmp_path, env=None):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "MPI4PY", "MASTER_"))}
    full["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full.update(env or {})
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    full["RESULTS"] = str(results)
    return subprocess.run([*argv, sys.executable, str(script), "a b", "c"], capture_output=True, text=True,
                          env=full, timeout=120, stdin=subprocess.DEVNULL)


def _ranks(tmp_path):
    import json

    records = (json.loads(path.read_text()) for path in (tmp_path / "results").glob("*.json"))
    return sorted(records, key=lambda e: int(e["RANK"]))


def test_under_openmpi(tmp_path):
    _need("mpirun.openmpi")
    proc = _run(["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", "3"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    ranks = _ranks(tmp_path)
    assert [(r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"]) for r in ranks] == [
        (str(i), str(i), "3", "3") for i in range(3)
    ]
    assert {r["MASTER_ADDR"] for r in ranks} == {"127.0.0.1"}
    assert len({r["MASTER_PORT"] for r in ranks}) == 1
    assert all(r["argv"] == ["a b", "c"] for r in ranks)


def test_under_hydra_with_the_mpich_shim(tmp_path):
    _need("mpiexec.hydra")
    shim = tmp_path / "shim"
    make_mpich_shim(str(shim))
    proc = _run(["mpiexec.hydra", "-n", "2"], tmp_path, env={"LD_LIBRARY_PATH": str(shim)})
    assert proc.returncode == 0, proc.stderr
    ranks = _ranks(tmp_path)
    assert [(r["RANK"], r["WORLD_SIZE"]) for r in ranks] == [("0", "2"), ("1", "2")]


def test_under_hydra_without_the_shim_says_what_to_do(tmp_path):
    _need("mpiexec.hydra")
    proc = _run(["mpiexec.hydra", "-n", "2"], tmp_path, env={"LD_LIBRARY_PATH": str(tmp_path / "empty")})
    assert proc.returncode != 0
    assert "python -m xrun.discovery --mpich-shim DIR" in proc.stderr


def test_wrong_abi_is_caught_not_silent(tmp_path):
    # Without the check every rank would see a world of one and train alone.
    _need("mpiexec.hydra")
    proc = _run(["mpiexec.hydra", "-n", "2"], tmp_path, env={"MPI4PY_MPIABI": "openmpi"})
    assert proc.returncode != 0
    assert "mpi4py's MPI sees rank 0 of 1" in proc.stderr
    assert "set MPI4PY_MPIABI=mpich" in proc.stderr
