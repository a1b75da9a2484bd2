"""The MPI backends for real on this machine (one node, ``localhost``): the engine starts the agent, the agent
reads its node rank from the engine, drops the run token and the engine's identity before starting ranks,
and the first failure decides the exit code. Cross-node runs are in tests/cluster/test_engine_jobs.py."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from tests.conftest import run_xrun

IMPI_BIN = os.environ.get("XRUN_IMPI_BIN", "/opt/xrun-impi/bin")

SCRIPT = r"""
import json, os, sys
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "XRUN_TOKEN", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMI_FD",
         "PMIX_RANK", "HYDI_CONTROL_FD", "WEIRD")
print(json.dumps({k: os.environ.get(k) for k in names} | {"args": sys.argv[1:]}), flush=True)
if "--mpi" in sys.argv:  # a rank may initialise MPI on its own (a singleton), not as the agent's peer
    from mpi4py import MPI
    print("MPI", MPI.COMM_WORLD.Get_size(), flush=True)
code = int(os.environ.get("FAIL_CODE", "0")) if os.environ["RANK"] == "1" else 0
sys.exit(code)
"""

ENGINES = {
    "openmpi": ("mpirun.openmpi", ["--launcher_args=--allow-run-as-root"], {}),
    "mpich": ("mpiexec.hydra", [], {}),
    "impi": (os.path.join(IMPI_BIN, "mpiexec.hydra"), [], {"PATH": f"{IMPI_BIN}:{os.environ.get('PATH', '')}"}),
}


def engine(name):
    program, args, env = ENGINES[name]
    if shutil.which(program) is None:
        reason = f"{program} not installed"
        if name != "impi" and os.environ.get("XRUN_REQUIRE_CLUSTER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return args, env


def lines(stdout):
    return {line.split("] ", 1)[0] + "]": line.split("] ", 1)[1] for line in stdout.splitlines() if "] " in line}


@pytest.mark.parametrize("name", list(ENGINES))
def test_engine_runs_the_node_agent(name, tmp_path, weird_args):
    args, env = engine(name)
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    weird = "v a l 'q' \"d\" $HOME\nnext"
    proc = run_xrun("--launcher", name, *args, "--num_gpus", "2", "--export", "WEIRD", "--no_local_rank",
                    str(script), *weird_args, env={**env, "WEIRD": weird}, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = lines(proc.stdout)
    assert set(out) == {"[localhost:0]", "[localhost:1]"}
    for key, text in out.items():
        record = json.loads(text)
        assert record["RANK"] == key[-2] and record["WORLD_SIZE"] == "2"
        assert record["args"] == list(weird_args)
        assert record["WEIRD"] == weird
        # neither the token nor the engine's own process identity reaches a rank
        assert {k: v for k, v in record.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "WEIRD", "args")
                and v is not None} == {}


@pytest.mark.parametrize("name", ["openmpi", "mpich"])
def test_first_failure_decides_the_exit_code(name, tmp_path):
    args, env = engine(name)
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    proc = run_xrun("--launcher", name, *args, "--num_gpus", "2", "--export", "FAIL_CODE", str(script),
                    env={**env, "FAIL_CODE": "9"}, cwd=str(tmp_path))
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert "job failed: rank 1 (local 1) on localhost exited with code 9" in proc.stderr


def test_a_rank_can_use_mpi_itself(tmp_path):
    pytest.importorskip("mpi4py")
    args, env = engine("openmpi")
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    # --no_dedupe: both ranks print the same line, and each must be seen (issue 17 shows it once by default)
    proc = run_xrun("--launcher", "openmpi", *args, "--num_gpus", "2", "--no_dedupe", str(script), "--mpi",
                    env={**env, "MPI4PY_MPIABI": "openmpi"}, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(text for key, text in lines(proc.stdout).items() if text.startswith("MPI")) == ["MPI 1", "MPI 1"]


def test_missing_engine_is_a_clear_error(tmp_path):
    proc = run_xrun("--launcher", "mvapich", "--num_gpus", "1", "x.py", env={"PATH": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.startswith("xrun: --launcher: mvapich: mpirun not found on PATH; load MVAPICH2")


@pytest.mark.parametrize("name", ["openmpi", "mpich"])
def test_the_engine_does_not_abort_an_agent_whose_result_arrived(name, tmp_path):
    """The agent exits 0 to its engine once its done reached the runner (issue 15): no engine abort, whose
    OpenMPI flavour spends 2 s on SIGCONT/sleep/SIGTERM/sleep/SIGKILL against an agent already gone."""
    args, env = engine(name)
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    proc = run_xrun("--launcher", name, *args, "--num_gpus", "2", "--export", "FAIL_CODE", str(script),
                    env={**env, "FAIL_CODE": "9"}, cwd=str(tmp_path))
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert "non-zero status" not in proc.stderr and "aborted" not in proc.stderr, proc.stderr


def test_engine_exit_code_is_zero_only_once_the_runner_has_the_result():
    from xrun.launch.session.machine import engine_exit_code

    assert engine_exit_code(9, delivered=True) == 0
    assert engine_exit_code(9, delivered=False) == 9


# -- an engine that cannot reach a node ends the start barrier at once (issue 25 §2) ------------------------------

UNREACHABLE = "127.0.0.5"  # a loopback address where nothing listens on port 22: ssh is refused at once
# hydra's ssh for the reachable node runs its command here instead: hydra then keeps waiting for the proxy it
# could not start, as it does on a cluster with one node down.
HALF_SSH = f"""#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -x|-q) shift;; -o|-p|-l) shift 2;; *) host=$1; shift; break;; esac; done
[ "$host" = "{UNREACHABLE}" ] && exec ssh -o BatchMode=yes "$host" "$@"
exec sh -c "$*"
"""


def refused(address, port=22):
    import socket

    try:
        socket.create_connection((address, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


@pytest.mark.slow
@pytest.mark.parametrize("name, half", [("mpich", False), ("mpich", True), ("openmpi", False)],
                         ids=["mpich", "mpich-one-node-up", "openmpi"])
def test_engine_that_cannot_reach_a_node_ends_the_barrier_at_once(name, half, tmp_path):
    args, env = engine(name)
    if shutil.which("ssh") is None or not refused(UNREACHABLE):
        pytest.skip(f"needs ssh and nothing listening on {UNREACHABLE}:22")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"up slots=1\n{UNREACHABLE} slots=1\n" if half else f"{UNREACHABLE} slots=1\n")
    if half:
        wrapper = tmp_path / "half-ssh"
        wrapper.write_text(HALF_SSH)
        wrapper.chmod(0o755)
        args = [*args, f"--launcher_args=-launcher ssh -launcher-exec {wrapper}"]
    (tmp_path / "quick.py").write_text("print('ran')\n")
    started = time.monotonic()
    proc = run_xrun("--launcher", name, *args, "-H", str(hosts), "--control_addr", "127.0.0.1",
                    "--join_timeout", "60", "quick.py", env=env, cwd=str(tmp_path), timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == 255, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (f"the session to {UNREACHABLE} exited with code 255 before its agent connected "
            f"(") in proc.stderr and f"ssh: connect to host {UNREACHABLE} port 22: Connection refused)" in proc.stderr
    assert elapsed < 15, elapsed  # ~3.5 s: the barrier does not wait out --join_timeout
