"""`xrun SCRIPT` on this machine, end to end, as a user runs it: real ranks, real exit codes, real files."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.harness import processes_with_marker
from tests.conftest import ROOT, run_xrun

HELLO = os.path.join(ROOT, "examples", "hello.py")


def rank_records(stdout, tag=""):
    """Parse `[host:rank] {json}` lines printed by examples/hello.py."""
    records = {}
    for line in stdout.splitlines():
        prefix, _, body = line.partition("] ")
        if body.startswith("{"):
            records[prefix + "]"] = json.loads(body)
    return records


def test_two_local_ranks_get_the_env_contract():
    result = run_xrun("--num_gpus", "2", HELLO, "--lr", "3e-4")
    assert result.returncode == 0, result.stderr
    records = rank_records(result.stdout)
    assert set(records) == {"[localhost:0]", "[localhost:1]"}
    for rank in (0, 1):
        record = records[f"[localhost:{rank}]"]
        assert record["RANK"] == record["LOCAL_RANK"] == str(rank)
        assert record["WORLD_SIZE"] == record["LOCAL_WORLD_SIZE"] == "2"
        assert record["MASTER_ADDR"] == "127.0.0.1" and record["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert record["argv"] == [f"--local_rank={rank}", "--lr", "3e-4"]


def test_weird_args_arrive_byte_exact(weird_args):
    result = run_xrun("--no_local_rank", HELLO, *weird_args)
    assert result.returncode == 0, result.stderr
    (record,) = rank_records(result.stdout).values()
    assert record["argv"] == list(weird_args)
    assert not os.path.exists("/tmp/xrun-pwned")


def test_user_environment_passes_through():
    script = "import os; print(os.environ['XRUN_TEST_VALUE'])"
    result = run_xrun("--no_python", "--no_local_rank", sys.executable, "-c", script,
                      env={"XRUN_TEST_VALUE": "a 'b' \"c\" $d\\e ✓"})
    assert result.returncode == 0
    assert result.stdout == "[localhost:0] a 'b' \"c\" $d\\e ✓\n"


def test_module_mode():
    result = run_xrun("--module", "--no_local_rank", "json.tool", "--help")
    assert result.returncode == 0 and "json.tool" in result.stdout


def test_first_failure_exit_code_and_report(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    print('something broke', file=sys.stderr); sys.exit(7)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    result = run_xrun("--num_gpus", "3", "--log_dir", str(tmp_path / "logs"), str(script))
    assert time.monotonic() - started < 30  # the sleepers were stopped, not waited for
    assert result.returncode == 7, result.stderr
    assert "something broke" in result.stderr
    assert "root cause" in result.stderr.lower()
    failure = json.loads((tmp_path / "logs" / "localhost" / "failure.json").read_text())
    assert "7" in json.dumps(failure)


def test_signal_death_exit_code(tmp_path):
    script = tmp_path / "segv.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    result = run_xrun(str(script))
    assert result.returncode == 128 + signal.SIGKILL
    assert "SIGKILL" in result.stderr


def test_per_rank_logs_and_no_prefix(tmp_path):
    logs = tmp_path / "logs"
    script = tmp_path / "talk.py"
    script.write_text("import os, sys\nprint('out', os.environ['RANK'])\nprint('err', os.environ['RANK'], file=sys.stderr)\n")
    for _ in range(2):  # the second run must not destroy the first one's logs
        result = run_xrun("--num_gpus", "2", "--log_dir", str(logs), "--no_prefix", str(script))
        assert result.returncode == 0
    assert sorted(result.stdout.splitlines()) == ["out 0", "out 1"]
    rank1 = logs / "localhost" / "rank1"
    assert (rank1 / "stdout.log").read_text() == "out 1\n"
    assert (rank1 / "stderr.log").read_text() == "err 1\n"
    assert len(list(rank1.iterdir())) == 4  # this run's two files and the previous run's, kept aside


def test_quiet_keeps_console_clean(tmp_path):
    result = run_xrun("--quiet", "--log_dir", str(tmp_path), HELLO)
    assert result.returncode == 0 and result.stdout == ""
    assert (tmp_path / "localhost" / "rank0" / "stdout.log").read_text().startswith("{")


def test_bind_cores_real_affinity():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs in the affinity mask")
    script = "import os; print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'])"
    result = run_xrun("--num_gpus", "2", "--bind_cores_to_rank", "--no_python", "--no_local_rank",
                      sys.executable, "-c", script)
    assert result.returncode == 0, result.stderr
    seen = sorted(line.split("] ", 1)[1] for line in result.stdout.splitlines())
    share = len(cpus) // 2
    assert seen == sorted(f"{cpus[i * share:(i + 1) * share]} {share}" for i in range(2))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_xrun_stops_everything(tmp_path, sig):
    marker = f"xrun-test-{os.getpid()}-{sig}"
    script = tmp_path / "sleep.py"
    # each rank's own line: two identical 'up' lines would be shown once (de-duplication, issue 17)
    script.write_text("import os, time\nprint('up', os.environ['RANK'], flush=True)\ntime.sleep(120)\n")
    env = dict(os.environ, XRUN_TEST_MARKER=marker)
    proc = subprocess.Popen([sys.executable, "-m", "xrun", "--num_gpus", "2", str(script)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = [proc.stdout.readline(), proc.stdout.readline()]
    assert all("up" in line for line in seen)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
    assert not processes_with_marker(f"XRUN_TEST_MARKER={marker}")


@pytest.mark.slow
@pytest.mark.torch
def test_ddp_example_trains_on_cpu():
    pytest.importorskip("torch")
    result = run_xrun("--num_gpus", "2", "--master_port", "0", os.path.join(ROOT, "examples", "train_ddp.py"),
                      "--steps", "3", timeout=240)
    assert result.returncode == 0, result.stderr
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in result.stdout.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert results[0]["param_checksum"] == results[1]["param_checksum"]  # DDP kept the replicas identical
    assert results[0]["allreduced_checksum"] == results[1]["allreduced_checksum"]
    assert abs(results[0]["allreduced_checksum"] - 2 * results[0]["param_checksum"]) < 1e-4
    assert {r["backend"] for r in results} == {"gloo"}
