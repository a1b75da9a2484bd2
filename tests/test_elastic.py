"""--elastic: flags, the rendezvous settings --join_timeout becomes, the wire spec, the worker's env and the
report (pure), and real local elastic runs under torch's agent (slow)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.conftest import ROOT, run_xrun
from xrun.common import rdzv
from xrun.common.agent_cli import parse_agent_argv
from xrun.common.result.outcome import RankOutcome
from xrun.common.spec import ElasticOptions, NodeSpec, RankSpec
from xrun.errors import UsageError
from xrun.launch.elastic.run import attempt_result, failure_outcomes, rank_script, start_line
from xrun.runner.cli import parse_request
from xrun.runner.planner import plan_job

EXAMPLE = os.path.join(ROOT, "examples", "train_elastic.py")


def request(*flags: str):
    req, _ = parse_request([*flags, "train.py", "--lr", "1"])
    return req


# -- flags -------------------------------------------------------------------------------------------------------


def test_elastic_flags_become_options():
    req = request("--elastic", "--nnodes", "1:4", "--max_restarts", "3", "--rdzv_id", "job7",
                  "--rdzv_conf", "last_call_timeout=5,keep_alive_interval=2", "--join_timeout", "600")
    assert req.elastic == ElasticOptions(
        min_nodes=1, max_nodes=4, max_restarts=3, rdzv_backend="c10d", rdzv_endpoint=None, rdzv_id="job7",
        rdzv_conf={"last_call_timeout": "5", "keep_alive_interval": "2"}, join_timeout=600.0,
    )
    assert req.args == ("--lr", "1")


def test_torchrun_spellings_and_min_max():
    req = request("--elastic", "--min-nodes", "2", "--max-nodes=3", "--max-restarts=1", "--rdzv-backend", "static")
    assert (req.elastic.min_nodes, req.elastic.max_nodes, req.elastic.max_restarts) == (2, 3, 1)
    assert request("--elastic", "--nnodes", "2").elastic.min_nodes == 2


def test_no_elastic_flags_means_static():
    assert request().elastic is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        # --max_restarts alone restarts a static job now (issue 23: tests/test_restarts.py); its elastic-only twin:
        (["--elastic", "--min_attempt_s", "5"], "--min_attempt_s: does not apply with --elastic"),
        # torchrun's --nnodes MIN:MAX is an elastic job now (issue 41: tests/test_torchrun_flags.py); a range backwards:
        (["--nnodes", "2:1"], "--nnodes: '2:1': MIN is more than MAX"),
        (["--elastic", "--nnodes", "1:x"], "--nnodes: '1:x' is not N or MIN:MAX"),
        (["--elastic", "--nnodes", "2", "--min_nodes", "1"], "--nnodes: give either"),
        (["--elastic", "--rdzv_backend", "zk"], "unknown backend 'zk'; known: c10d, static, etcd, etcd-v2"),
        (["--elastic", "--rdzv_conf", "timeout=1800"], "c10d ignores 'timeout': use --join_timeout"),
        (["--elastic", "--rdzv_conf", "join_timout=5"], "c10d does not read 'join_timout'"),
        (["--elastic", "--rdzv_conf", "read_timeout=soon"], "read_timeout='soon': must be a positive whole number"),
        (["--elastic", "--rdzv_conf", "novalue"], "'novalue' is not KEY=VALUE"),
        (["--elastic", "--rdzv_backend", "static", "--rdzv_conf", "rank=1"], "'rank': xrun sets it"),
        (["--elastic", "--rdzv_backend", "static", "--rdzv_conf", "join_timeout=9"], "static does not read"),
    ],
)
def test_bad_elastic_flags_are_errors(flags, message):
    with pytest.raises(UsageError, match=None) as err:
        request(*flags)
    assert message in str(err.value)


def test_unknown_rdzv_conf_key_is_an_error_on_the_command_line():
    result = run_xrun("--elastic", "--rdzv_conf", "timeout=1800", "--dry-run", "x.py")
    assert result.returncode == 2
    assert "c10d ignores 'timeout': use --join_timeout SECONDS" in result.stderr


# -- rendezvous settings -----------------------------------------------------------------------------------------


def opts(**kw):
    base = dict(min_nodes=3, max_nodes=3, rdzv_endpoint="node1:29500", rdzv_id="r", join_timeout=1800.0)
    base.update(kw)
    return ElasticOptions(**base)


def test_join_timeout_becomes_every_c10d_start_up_timeout():
    assert rdzv.rendezvous_configs(opts(), 0) == {
        "join_timeout": "1800", "read_timeout": "1800", "last_call_timeout": "1800",
    }


def test_last_call_stays_short_when_nodes_may_join_later():
    conf = rdzv.rendezvous_configs(opts(min_nodes=2, join_timeout=99.2), 1)
    assert conf == {"join_timeout": "100", "read_timeout": "100"}
    shown = rdzv.effective_timeouts(opts(min_nodes=2, join_timeout=99.2), 1)
    assert shown == {"close_timeout": "30", "heartbeat_timeout": "5", "join_timeout": "100",
                     "last_call_timeout": "30", "read_timeout": "100"}


def test_user_keys_win_and_static_gets_rank_and_timeout():
    assert rdzv.rendezvous_configs(opts(rdzv_conf={"read_timeout": "7"}), 0)["read_timeout"] == "7"
    assert rdzv.rendezvous_configs(opts(rdzv_backend="static"), 2) == {"timeout": "1800", "rank": 2}
    assert rdzv.rendezvous_configs(opts(rdzv_backend="etcd"), 2) == {"timeout": "1800"}


def test_configs_are_what_torch_reads():
    """Every key xrun sets is one the installed torch reads (a silently ignored key is the bug we prevent)."""
    pytest.importorskip("torch")
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler  # noqa: F401

    params = RendezvousParameters("c10d", "localhost:0", "r", 1, 1, **rdzv.rendezvous_configs(opts(join_timeout=42), 0))
    assert params.get_as_int("read_timeout") == 42 and params.get_as_int("join_timeout") == 42


def test_static_node_0_hosts_the_store():
    """torch's static handler serves the store where ``rank == 0``: a string "0" made every node a client of a
    store nobody served, and the job never started (issue 25)."""
    pytest.importorskip("torch")
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import create_rdzv_handler

    for node_rank in (0, 1):
        conf = rdzv.rendezvous_configs(opts(rdzv_backend="static"), node_rank)
        handler = create_rdzv_handler(RendezvousParameters("static", "127.0.0.1:1", "r", 2, 2, **conf))
        assert (handler.rank == 0) is (node_rank == 0)


@pytest.mark.parametrize(
    ("kw", "hosts", "message"),
    [
        (dict(min_nodes=0), 1, "--min_nodes: must be at least 1"),
        (dict(min_nodes=3, max_nodes=2), 1, "--max_nodes: 2 is less than --min_nodes 3"),
        (dict(max_nodes=2), 3, "--max_nodes: 2 is less than the 3 hosts selected"),
        (dict(max_restarts=-1), 1, "--max_restarts: must be >= 0"),
        (dict(join_timeout=0), 1, "--join_timeout: must be > 0"),
        (dict(rdzv_backend="static", min_nodes=1), 2, "static needs exactly the 2 selected nodes"),
    ],
)
def test_check_elastic(kw, hosts, message):
    with pytest.raises(UsageError) as err:
        rdzv.check_elastic(ElasticOptions(**kw), hosts)
    assert message in str(err.value)


# -- plan and wire spec ------------------------------------------------------------------------------------------


def test_plan_fills_counts_endpoint_and_id(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=2\nb slots=2\nc slots=2\n")
    req, _ = parse_request(["-H", str(hosts), "--launcher", "ssh", "--run_id", "job", "--elastic", "--min_nodes", "2",
                            "train.py"])
    plan = plan_job(req)
    elastic = plan.nodes[1].elastic
    assert (elastic.min_nodes, elastic.max_nodes, elastic.rdzv_endpoint, elastic.rdzv_id) == (2, 3, "a:29500", "job")
    # No barrier placeholder: every elastic node must know the endpoint before node 0 is up.
    assert plan.rendezvous.master_addr == "a"


def test_no_ssh_nodes_agree_on_the_rendezvous_id_without_a_run_id(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=1\nb slots=1\n")
    ids = {plan_job(parse_request(["-H", str(hosts), "--no_ssh", "--node_rank", str(k), "--elastic", "t.py"])[0])
           .nodes[k].elastic.rdzv_id for k in (0, 1)}
    assert ids == {"xrun-a-29500"}
    explicit = plan_job(parse_request(["-H", str(hosts), "--no_ssh", "--node_rank", "1", "--run_id", "j7", "--elastic",
                                       "t.py"])[0])
    assert explicit.nodes[1].elastic.rdzv_id == "j7"


def test_local_elastic_plan_uses_loopback_and_a_free_port():
    req, _ = parse_request(["--elastic", "--master_port", "0", "train.py"])
    plan = plan_job(req)
    endpoint = plan.nodes[0].elastic.rdzv_endpoint
    assert endpoint.startswith("127.0.0.1:") and not endpoint.endswith(":0")
    assert (plan.nodes[0].elastic.min_nodes, plan.nodes[0].elastic.max_nodes) == (1, 1)


def test_node_spec_round_trips_with_elastic():
    spec = NodeSpec(host="h", node_rank=1, ranks=(RankSpec(1, 0, {"A": "1"}, ("python", "x.py")),),
                    elastic=opts(rdzv_conf={"keep_alive_interval": "1"}))
    assert NodeSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert "elastic" not in NodeSpec(host="h", node_rank=0, ranks=()).to_json()


def test_agent_command_line_carries_elastic():
    command = parse_agent_argv(["--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19", "--node_rank=0", "--elastic",
                                "--nnodes=1:2", "--max_restarts=2", "--join_timeout=60", "train.py"])
    spec = command.node_spec()
    assert spec.elastic.max_nodes == 2 and spec.elastic.join_timeout == 60.0
    from xrun.common.command import agent_argv

    again = parse_agent_argv(list(agent_argv(command)[4:]))
    assert again.node_spec() == spec


# -- the worker's env and the report -----------------------------------------------------------------------------


def test_rank_script_adds_xrun_contract_on_top_of_torch_and_execs(tmp_path, weird_args):
    import subprocess

    argv = ["python3", "-c", "import json, os, sys; print(json.dumps([dict(os.environ), sys.argv[1:]]))", *weird_args]
    out, err = tmp_path / "out", tmp_path / "err"
    text = rank_script(argv, {"CUDA_VISIBLE_DEVICES": "0,1", "WEIRD": "a 'b' $HOME\nc", "bad-name": "x"},
                       stdout=str(out), stderr=str(err), setpriv=None)
    torch_env = {"PATH": os.environ["PATH"], "RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "2",
                 "GROUP_WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2"}
    subprocess.run(["/bin/sh", "-c", text], env=torch_env, check=True)
    env, args = json.loads(out.read_text())
    assert args == list(weird_args)
    assert env["RANK"] == "5"  # torch's rendezvous decides, not the static plan
    assert (env["CROSS_RANK"], env["NODE_RANK"], env["CROSS_SIZE"], env["LOCAL_SIZE"]) == ("2", "2", "3", "2")
    assert (env["CUDA_VISIBLE_DEVICES"], env["WEIRD"]) == ("0,1", "a 'b' $HOME\nc")
    assert "bad-name" not in env


def test_rank_script_binds_with_taskset_and_pdeathsig():
    text = rank_script(["python", "x.py"], {}, stdout="/o", stderr="/e", cpus=[0, 1, 2], taskset="/usr/bin/taskset",
                       setpriv="/usr/bin/setpriv")
    assert text.splitlines()[-1] == "exec /usr/bin/setpriv --pdeathsig TERM -- /usr/bin/taskset -c 0-2 python x.py"


def outcome(rank, code=None, sig=None, stopped=False):
    return RankOutcome(host="h", rank=rank, local_rank=rank, pid=100 + rank, returncode=code, signal=sig,
                       runtime_s=1.0, stderr_tail=("boom",), stopped_by_xrun=stopped)


def test_attempt_result_root_cause_is_first_own_failure():
    result = attempt_result("h", [(5.0, outcome(0, sig=signal.SIGTERM, stopped=True)), (3.0, outcome(2, code=1)),
                                  (2.0, outcome(1, code=7))], None)
    assert result.root_cause.rank == 1 and result.exit_code == 7
    assert [o.rank for o in result.outcomes] == [0, 1, 2]
    assert attempt_result("h", [(1.0, outcome(0, code=0))], None).exit_code == 0
    interrupted = attempt_result("h", [(1.0, outcome(0, sig=15, stopped=True))], signal.SIGINT)
    assert (interrupted.root_cause, interrupted.exit_code) == (None, 130)


def test_failure_outcomes_from_torch_failures():
    class Failure:
        def __init__(self, pid, exitcode, timestamp):
            self.pid, self.exitcode, self.timestamp = pid, exitcode, timestamp

    found = failure_outcomes("h", {0: 4, 1: 5}, {0: 10, 1: 11}, {5: Failure(11, -11, 100)}, {1: ("segv",)}, 2.0,
                             stopped_all=False)
    result = attempt_result("h", found, None)
    assert result.root_cause.rank == 5 and result.root_cause.signal == signal.SIGSEGV and result.exit_code == 139
    assert result.root_cause.stderr_tail == ("segv",)
    assert result.outcomes[0].stopped_by_xrun
    stopped = attempt_result("h", failure_outcomes("h", {0: 4}, {0: 10}, {}, {}, 1.0, stopped_all=True), 15)
    assert (stopped.root_cause, stopped.exit_code) == (None, 143)


def test_failure_outcomes_order_by_the_exit_seen_not_torchs_whole_seconds():
    class Failure:
        def __init__(self, pid, exitcode, timestamp):
            self.pid, self.exitcode, self.timestamp = pid, exitcode, timestamp

    # Both failures carry torch's same whole-second timestamp: without exit times rank 0 (lower) would win.
    failures = {0: Failure(10, -6, 100), 1: Failure(11, 7, 100)}
    tie = attempt_result("h", failure_outcomes("h", {0: 0, 1: 1}, {0: 10, 1: 11}, failures, {}, 1.0,
                                                stopped_all=False), None)
    assert tie.root_cause.rank == 0
    seen = failure_outcomes("h", {0: 0, 1: 1}, {0: 10, 1: 11}, failures, {}, 1.0, stopped_all=False,
                            exit_times={0: 100.30, 1: 100.25})
    result = attempt_result("h", seen, None)
    assert (result.root_cause.rank, result.exit_code) == (1, 7)


def test_start_line_names_every_timeout():
    spec = NodeSpec(host="h", node_rank=0, ranks=(), elastic=opts(min_nodes=2))
    line = start_line(spec.elastic, spec, "2.13.0", 1800.0)
    assert "join_timeout=1800 s" in line and "read_timeout=1800 s" in line and "last_call_timeout=30 s" in line
    assert "exit barrier 1800 s" in line and "nodes 2..3" in line


# -- real runs under torch's elastic agent (this machine only) ---------------------------------------------------


def elastic_run(tmp_path, *flags, script_args=(), timeout=180):
    return run_xrun("--elastic", "--num_gpus", "2", "--master_port", "0", "--rdzv_conf", "last_call_timeout=1",
                    *flags, EXAMPLE, "--checkpoint", str(tmp_path / "ckpt.pt"), "--step_time", "0.05",
                    *script_args, cwd=str(tmp_path), timeout=timeout, env={"TORCH_CPP_LOG_LEVEL": "ERROR"})


@pytest.mark.slow
@pytest.mark.torch
def test_local_crash_restarts_and_resumes_from_checkpoint(tmp_path, weird_args):
    pytest.importorskip("torch")
    result = elastic_run(tmp_path, "--max_restarts", "2",
                         script_args=("--steps", "6", "--crash_rank", "1", "--crash_at_step", "3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 1 (local 1) exited with code 7; restarting the worker group (restart 1 of 2)" in result.stderr, result.stderr
    assert "[localhost:0] resume rank 0 from step 2" in result.stdout
    # rank 0's summary; rank 1's last step line may come after it (two processes: no order across ranks)
    [summary] = [line for line in result.stdout.splitlines() if '] {"done"' in line]
    done = json.loads(summary.split("] ", 1)[1])
    assert done == {"done": True, "steps": 6, "resumed_from": 3, "world": 2, "restart": 1}


@pytest.mark.slow
@pytest.mark.torch
def test_a_rendezvous_nobody_else_joins_says_what_timed_out(tmp_path):
    # torch's RendezvousTimeoutError has no message: the line ended in "RendezvousTimeoutError: "
    pytest.importorskip("torch")
    (tmp_path / "ok.py").write_text("pass\n")
    result = run_xrun("--elastic", "--nnodes", "2:2", "--join_timeout", "2", "ok.py", cwd=str(tmp_path), timeout=120,
                      env={"TORCH_CPP_LOG_LEVEL": "ERROR"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert ("rendezvous failed: RendezvousTimeoutError: not every node joined within --join_timeout\n"
            in result.stderr), result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.torch
def test_local_exhausted_restarts_fail_with_the_real_exit_code(tmp_path):
    pytest.importorskip("torch")
    result = elastic_run(tmp_path, "--max_restarts", "1", "--log_dir", str(tmp_path / "logs"),
                         script_args=("--steps", "4", "--crash_rank", "1", "--crash_at_step", "1", "--crash_always",
                                      "--crash_code", "9"))
    assert result.returncode == 9, result.stderr[-3000:]
    assert "restarting the worker group (restart 1 of 1)" in result.stderr
    assert "xrun: node localhost: rank 1 failed first: exit code 9" in result.stderr
    assert "rank 1 crashing at step 1 (restart 1)" in result.stderr
    report = json.loads((tmp_path / "logs" / "localhost" / "failure.json").read_text())
    assert report["root_cause"] == 1 and report["exit_code"] == 9
    # Both attempts' logs are kept (the first one renamed with its time).
    assert len(list((tmp_path / "logs" / "localhost" / "rank1").glob("stderr*.log"))) == 2


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_every_rendezvous_backend_starts_at_once(tmp_path, backend):
    # static used to wait out --join_timeout and then torch's own retries: nobody served its store (issue 25).
    pytest.importorskip("torch")
    started = time.monotonic()
    # No --rdzv_conf: static reads none of c10d's keys.
    result = run_xrun("--elastic", "--rdzv_backend", backend, "--num_gpus", "2", "--master_port", "0",
                      "--join_timeout", "60", EXAMPLE, "--checkpoint", str(tmp_path / "ckpt.pt"), "--steps", "2",
                      "--step_time", "0.05", cwd=str(tmp_path), timeout=60, env={"TORCH_CPP_LOG_LEVEL": "ERROR"})
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{backend} rendezvous at" in result.stderr
    assert "rendezvous complete: node 0 of 1, ranks 0-1 of 2" in result.stderr
    assert elapsed < 45, elapsed  # ~7 s idle; the bound is for 2 loaded cores, and still under --join_timeout


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script", ["ok.py", "fail.py"])
def test_the_end_is_noticed_at_once_whatever_the_monitor_interval(tmp_path, script):
    # issue 33 §3: torch's agent slept --monitor_interval between looks: the job's end was noticed 1,000 s late
    pytest.importorskip("torch")
    (tmp_path / "ok.py").write_text("print('done', flush=True)\n")
    (tmp_path / "fail.py").write_text("import sys\nsys.exit(5)\n")
    started = time.monotonic()
    result = run_xrun("--elastic", "--num_gpus", "2", "--master_port", "0", "--max_restarts", "1",
                      "--monitor_interval", "1e3", script, cwd=str(tmp_path), timeout=120,
                      env={"TORCH_CPP_LOG_LEVEL": "ERROR"})
    elapsed = time.monotonic() - started
    assert result.returncode == (0 if script == "ok.py" else 5), result.stderr[-3000:]
    if script == "fail.py":  # the failure, the restart and the second failure: each seen at once
        assert "restarting the worker group (restart 1 of 1)" in result.stderr, result.stderr[-3000:]
    assert elapsed < 60, elapsed  # ~3 s idle (~6 s with the restart); 1,000 s before


def test_monitor_sleep_ends_when_a_worker_exits_and_only_then():
    import threading

    from xrun.launch.elastic.torch_agent import _WakeableTime

    wake = threading.Event()
    clock = _WakeableTime(wake)
    assert clock.monotonic() > 0  # the rest of the time module, as torch's agent uses it
    started = time.monotonic()
    clock.sleep(0.05)
    assert time.monotonic() - started >= 0.05  # nothing exited: the whole interval
    threading.Timer(0.05, wake.set).start()
    started = time.monotonic()
    clock.sleep(100)
    assert time.monotonic() - started < 5 and not wake.is_set()  # cut short, and ready for the next exit


def test_dry_run_shows_the_elastic_agent_command():
    result = run_xrun("--elastic", "--nnodes", "1:2", "--max_restarts", "2", "--master_port", "29555", "--run_id", "j",
                      "--dry-run", "x.py")
    assert result.returncode == 0, result.stderr
    assert ("--elastic --min_nodes=1 --max_nodes=2 --max_restarts=2 --rdzv_endpoint=127.0.0.1:29555 --rdzv_id=j -- x.py"
            in result.stdout)
