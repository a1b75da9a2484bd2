"""Whole-job restarts (issue 23, ``--max_restarts`` on a static job).

Pure: the attempt rules (``xrun.runner.job.attempts``) and the job state machine's restart of every node, played
as event sequences. Processes: the local backend's loop of attempts (``python -m xrun`` on this machine) and the
head's control server with real agents started locally (``tests.test_control``'s harness, no ssh).
"""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from tests.conftest import ROOT
from tests.headserver import console_of
from tests.report_browser import open_report
from tests.test_control import LocalSessions
from tests.test_job import JOINED, STARTED, STATIC, hello, play
from xrun.common.output.status import PlainStatus
from xrun.common.rankplan import LaunchOptions
from xrun.runner.backends.channel import Endpoint
from xrun.runner.job.attempts import Ending, decide, no_progress, same_way
from xrun.runner.job.control_server import ControlServer
from xrun.runner.job.events import (
    AgentError,
    Attempt,
    ConnectionLost,
    Done,
    Failure,
    Hung,
    RankExited,
    Ready,
    SendPing,
    SendRestart,
    SendStart,
    SendStop,
    SendVerdict,
    ShowLine,
    SignalReceived,
    Tick,
)
from xrun.runner.job.gate import Gate
from xrun.runner.job.keys import NodeKeys
from xrun.runner.job.last_words import report_lines
from xrun.runner.job.nodes import NodeState
from xrun.runner.plan import JobRequest, make_plan
from xrun.runner.restart_options import RestartPolicy

RESTARTS = replace(STATIC, restart=RestartPolicy(max_restarts=2, min_attempt_s=60.0))
CRASH = Failure("b", "rank 2 (local 0) on b exited with code 7", 7, rank=2)


def attempt(n, failure, ran=1.0):
    return Attempt(n, began_at=0.0, ran_s=ran, failure=failure)


# -- the rules, pure ----------------------------------------------------------------------------------------------

RULES = [
    ("success is final", RestartPolicy(2), [attempt(0, None)], False, 0, Ending.FINAL),
    ("a failure restarts", RestartPolicy(2), [attempt(0, CRASH)], False, 0, Ending.RESTART),
    ("no restarts asked for", RestartPolicy(0), [attempt(0, CRASH)], False, 0, Ending.FINAL),
    ("a signal is final", RestartPolicy(2), [attempt(0, CRASH)], True, 0, Ending.FINAL),
    ("a final failure (a usage error) is final", RestartPolicy(2), [attempt(0, CRASH._replace(final=True))], False,
     0, Ending.FINAL),
    ("a lost node without a spare", RestartPolicy(2), [attempt(0, CRASH)], False, 1, Ending.NODE_LOST),
    ("--spares without --max_restarts: a lost node ends the job, no spare takes its place",
     RestartPolicy(0, spares=1), [attempt(0, CRASH)], False, 1, Ending.NODE_LOST),
    ("--spares without --max_restarts: a rank's failure is final", RestartPolicy(0, spares=1), [attempt(0, CRASH)],
     False, 0, Ending.FINAL),
    ("the restarts used up", RestartPolicy(2, 0.0), [attempt(0, CRASH), attempt(1, CRASH), attempt(2, CRASH)],
     False, 0, Ending.EXHAUSTED),
    ("the same failure twice, both short: no progress", RestartPolicy(5), [attempt(0, CRASH), attempt(1, CRASH)],
     False, 0, Ending.NO_PROGRESS),
    ("the same failure, the first ran long: progress", RestartPolicy(5),
     [attempt(0, CRASH, ran=61.0), attempt(1, CRASH)], False, 0, Ending.RESTART),
    ("another rank the second time: progress", RestartPolicy(5),
     [attempt(0, CRASH), attempt(1, CRASH._replace(rank=3))], False, 0, Ending.RESTART),
    ("another code the second time: progress", RestartPolicy(5),
     [attempt(0, CRASH), attempt(1, CRASH._replace(exit_code=9))], False, 0, Ending.RESTART),
    ("--min_attempt_s 0: never no-progress", RestartPolicy(5, 0.0), [attempt(0, CRASH), attempt(1, CRASH)],
     False, 0, Ending.RESTART),
]


@pytest.mark.parametrize("policy, history, interrupted, missing, expected", [r[1:] for r in RULES],
                         ids=[r[0] for r in RULES])
def test_what_follows_an_attempt(policy, history, interrupted, missing, expected):
    assert decide(policy, history, interrupted=interrupted, nodes_missing=missing) is expected


def test_node_level_failures_compare_by_host_and_code():
    lost = Failure("c", "lost node c: its agent's connection dropped", 1)
    assert same_way(lost, lost._replace(reason="lost node c: no word from its agent"))
    assert not same_way(lost, lost._replace(host="b"))
    assert not same_way(lost, CRASH) and not same_way(None, CRASH)
    assert no_progress(RestartPolicy(3), [attempt(0, lost), attempt(1, lost)])


# -- the machine ------------------------------------------------------------------------------------------------

CRASHED = [*STARTED, RankExited(1, rank=2, local_rank=0, code=7), Done(0, 143), Done(1, 7), Done(2, 143)]


def test_a_failure_restarts_every_node_with_a_fresh_port_then_starts_attempt_1():
    job, actions = play(CRASHED, config=RESTARTS)
    assert job.all_over_at is None  # not over: the next attempt begins
    assert ShowLine("restarting the job on every node: attempt 1 of 3 (after: rank 2 (local 0) on b exited with "
                    "code 7)") in actions
    assert SendRestart((0, 1, 2), 1, True, 0) in actions  # node 0 picks a fresh port
    assert {job.state(n) for n in range(3)} == {NodeState.JOINED}
    job, actions = play([Ready(0, 40001), Ready(1), Ready(2)], job)
    assert SendStart((0, 1, 2), "10.0.0.1", 40001, attempt=1) in actions


def test_a_given_master_port_is_checked_again_not_replaced():
    config = replace(RESTARTS, master_port=29500)
    _, actions = play(CRASHED, config=config)
    assert SendRestart((0, 1, 2), 1, False, 29500) in actions


def test_success_after_a_restart_ends_with_0_and_tells_the_waiting_agents():
    job, _ = play(CRASHED, config=RESTARTS)
    job, actions = play([Ready(0, 40001), Ready(1), Ready(2), 70.0, Done(0), Done(1), Done(2)], job)
    verdict = job.verdict()
    assert verdict.exit_code == 0 and [a.number for a in verdict.attempts] == [0, 1]
    assert [a for a in actions if isinstance(a, SendVerdict)] == [SendVerdict((0, 1, 2), verdict)]
    assert verdict.restart_lines[0] == "the job ran 2 attempts (1 restart(s))"


def test_restarts_exhausted_exit_with_the_last_failures_code_and_each_attempts_cause():
    config = replace(RESTARTS, restart=RestartPolicy(max_restarts=2, min_attempt_s=0.0))
    job, _ = play(CRASHED, config=config)
    for code in (8, 9):
        job, _ = play([Ready(0, 40001), Ready(1), Ready(2), RankExited(2, rank=3, local_rank=0, code=code),
                       Done(0, 143), Done(1, 143), Done(2, code)], job)
    verdict = job.verdict()
    assert job.all_over_at is not None and verdict.exit_code == 9
    lines = report_lines(verdict)
    assert lines[0] == "job failed: rank 3 (local 0) on c exited with code 9; every node stopped 0.00 s later"
    assert lines[1:] == ["2 restart(s) exhausted (--max_restarts 2)",
                         "  attempt 0 (0.0 s): rank 2 (local 0) on b exited with code 7",
                         "  attempt 1 (0.0 s): rank 3 (local 0) on c exited with code 8",
                         "  attempt 2 (0.0 s): rank 3 (local 0) on c exited with code 9"]


def test_the_same_quick_failure_twice_stops_for_lack_of_progress():
    job, _ = play(CRASHED, config=RESTARTS)
    job, _ = play([Ready(0, 40001), Ready(1), Ready(2), RankExited(1, rank=2, local_rank=0, code=7),
                   Done(0, 143), Done(1, 7), Done(2, 143)], job)
    verdict = job.verdict()
    assert job.all_over_at is not None and verdict.exit_code == 7
    assert verdict.restart_lines[0].startswith("stopped restarting: no progress: attempts 0 and 1 failed the same way")


def test_a_lost_node_without_a_spare_ends_the_job_naming_it():
    job, _ = play([*STARTED, ConnectionLost(2, "connection closed"), Done(0, 143), Done(1, 143)], config=RESTARTS)
    verdict = job.verdict()
    assert job.all_over_at is not None and verdict.exit_code == 1
    assert "lost node c" in verdict.failure.reason
    assert verdict.restart_lines[0] == "stopped restarting after 0 restart(s): 1 node(s) lost (c)"  # no --spares


def test_a_signal_is_never_restarted():
    job, actions = play([*STARTED, SignalReceived(int(signal.SIGINT)), Done(0), Done(1), Done(2)], config=RESTARTS)
    assert job.all_over_at is not None and job.verdict().exit_code == 130
    assert not [a for a in actions if isinstance(a, SendRestart)]


def test_a_busy_given_port_is_not_restarted():
    job, _ = play([*JOINED, AgentError(0, "--master_port: port 29500 is already in use on a", 2), Done(1), Done(2)],
                  config=RESTARTS)
    assert job.all_over_at is not None and job.verdict().exit_code == 2


def test_hangs_restart_only_with_hang_action_restart():
    steps = [*STARTED, Hung("no rank on any node wrote output"), Done(0, 143), Done(1, 143), Done(2, 143)]
    job, _ = play(steps, config=RESTARTS)
    assert job.all_over_at is not None and job.verdict().exit_code == 124
    job, actions = play([*steps[:-4], Hung("silence", restart=True), *steps[-3:]], config=RESTARTS)
    assert job.all_over_at is None and SendRestart((0, 1, 2), 1, True, 0) in actions


def test_agents_done_with_an_attempt_are_still_pinged():
    job, _ = play([*STARTED, RankExited(1, rank=2, local_rank=0, code=7), Done(1, 7)], config=RESTARTS)
    _, actions = play([5.0, Tick()], job)
    assert SendPing((0, 1, 2)) in actions


def test_a_stop_goes_to_every_node_of_the_current_attempt():
    job, _ = play(CRASHED, config=RESTARTS)
    job, actions = play([Ready(0, 40001), Ready(1), Ready(2), RankExited(0, rank=0, local_rank=0, code=5)], job)
    assert [a for a in actions if isinstance(a, SendStop)] == [
        SendStop((0, 1, 2), int(signal.SIGTERM), 10.0, "rank 0 (local 0) on a exited with code 5")]
    assert hello(0) is not None  # the helpers are shared with tests.test_job


# -- the local backend: a loop of attempts in xrun's own process -------------------------------------------------

FLAKY = """
import os, sys, time
n = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("attempt", n, os.environ["TORCHELASTIC_MAX_RESTARTS"], os.environ["RANK"], os.environ["MASTER_PORT"])
open(f"printed-{n}-{os.environ['RANK']}", "w").close()
if os.environ["RANK"] == "1" and n < int(os.environ.get("FAILS", "1")):
    deadline = time.monotonic() + 10  # rank 0 has printed before the failure stops it (the test counts its line)
    while not os.path.exists(f"printed-{n}-0") and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(3)
"""


def xrun(tmp_path, *args, env=None, **kwargs):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    environ = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-m", "xrun", "--num_gpus", "2", "--no_local_rank", *args, str(script)],
                          env=environ, capture_output=True, text=True, timeout=60, cwd=tmp_path, **kwargs)


def test_local_a_rank_that_fails_once_succeeds_on_attempt_1(tmp_path):
    done = xrun(tmp_path, "--max_restarts", "2", "--log_dir", str(tmp_path / "logs"))
    assert done.returncode == 0, done.stderr
    seen = [line.split("] ", 1)[1].split() for line in done.stdout.splitlines() if "attempt" in line]
    assert sorted((s[1], s[3]) for s in seen) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {s[2] for s in seen} == {"2"}  # TORCHELASTIC_MAX_RESTARTS
    ports = {s[1]: s[4] for s in seen}
    assert ports["0"] != ports["1"]  # every attempt its own port
    assert "xrun: restarting the job: attempt 1 of 3" in done.stderr


def test_local_summary_json_has_the_history_a_connected_job_has(tmp_path):
    """Issue 38: the local run's job-level summary.json, as the head writes one (test_head_summary_json_has_the_history)."""
    logs = tmp_path / "logs"
    done = xrun(tmp_path, "--max_restarts", "2", "--log_dir", str(logs))
    assert done.returncode == 0, done.stderr
    summary = json.loads((logs / "summary.json").read_text())
    assert [a["attempt"] for a in summary["attempts"]] == [0, 1]
    first, last = summary["attempts"]
    assert (first["exit_code"], first["rank"], first["host"]) == (3, 1, "localhost")
    assert first["root_cause"] == "rank 1 (local 1) on localhost exited with code 3"
    assert last["root_cause"] is None and last["began_at_s"] >= first["ended_at_s"] > first["began_at_s"] == 0.0
    assert (summary["exit_code"], summary["end"], summary["root_cause"]) == (0, None, None)
    assert [r["rank"] for r in summary["ranks"]] == [0, 1] and summary["ranks_ok"] == 2  # the last attempt's ranks
    assert (logs / "localhost" / "summary.json").exists()  # the node's own, beside it as on every node


def test_local_summary_json_without_restarts_says_how_the_job_ended(tmp_path):
    logs = tmp_path / "logs"
    done = xrun(tmp_path, "--log_dir", str(logs), env={"FAILS": "99"})
    assert done.returncode == 3, done.stderr
    summary = json.loads((logs / "summary.json").read_text())
    assert "attempts" not in summary and "stragglers" not in summary  # no restarts asked for, no torch
    assert summary["end"] == "job failed: rank 1 (local 1) on localhost exited with code 3"
    assert summary["root_cause"] == {"reason": "rank 1 (local 1) on localhost exited with code 3",
                                     "host": "localhost", "rank": 1, "exit_code": 3}
    assert summary["exit_code"] == 3 and summary["interrupted_by"] is None


def test_local_a_rank_that_always_fails_stops_after_n_restarts_with_its_code(tmp_path):
    done = xrun(tmp_path, "--max_restarts", "2", "--min_attempt_s", "0", env={"FAILS": "99"})
    assert done.returncode == 3, done.stderr
    assert "xrun: 2 restart(s) exhausted (--max_restarts 2)" in done.stderr
    assert done.stderr.count("exited with code 3\n") >= 3


def test_local_the_same_quick_failure_twice_stops_early(tmp_path):
    done = xrun(tmp_path, "--max_restarts", "5", env={"FAILS": "99"})
    assert done.returncode == 3, done.stderr
    assert "xrun: stopped restarting: no progress: attempts 0 and 1" in done.stderr
    assert "attempt 2 of" not in done.stderr


def test_local_ctrl_c_during_an_attempt_gives_130_and_no_restart(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import os, time\nprint('up', os.getpid(), flush=True)\ntime.sleep(60)\n")
    environ = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-m", "xrun", "--num_gpus", "2", "--no_local_rank", "--max_restarts",
                             "3", str(script)], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    pids = [int(proc.stdout.readline().split()[-1]) for _ in range(2)]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "restarting" not in err
    time.sleep(0.2)
    for pid in pids:
        assert not _alive(pid)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


# -- the head's control server with real agents (no ssh) ---------------------------------------------------------

def serve(plan):
    """The control server on loopback and the plan's agents as local processes (tests.test_control's way); the
    head's console kept in a list."""
    nodes = len(plan.nodes)
    gate = Gate(NodeKeys.shared_secret(nodes, "t0ken"), nodes=nodes, prove_server=False)
    server = ControlServer(plan, gate, join_timeout=30.0, status=PlainStatus(nodes))
    shown = console_of(server)
    port = server.listen(["127.0.0.1"])
    return server, LocalSessions(plan, Endpoint("127.0.0.1", port, "t0ken", gate.fingerprint)), shown


def run_restarting_job(tmp_path, env, *, max_restarts=2, min_attempt_s=60.0):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    world = {"a": (0, 1), "b": (0,)}
    request = JobRequest(script=str(script), master_port=0, launch=LaunchOptions(python=sys.executable, local_rank_arg=False),
                         env=env, cwd=str(tmp_path), restart=RestartPolicy(max_restarts, min_attempt_s))
    plan = make_plan(request, world, "ssh")
    server, sessions, shown = serve(plan)
    code = server.run(sessions, own_signals=False)
    sessions.terminate()
    out = b"".join([*shown, *(sessions.output.get(h, b"") for h in world)]).decode()
    return code, out, server, sessions


def test_head_a_rank_crash_restarts_every_node_over_the_same_agents(tmp_path):
    code, out, server, sessions = run_restarting_job(tmp_path, {})
    assert code == 0, out
    seen = sorted(tuple(line.split("] ", 1)[1].split()[1:4]) for line in out.splitlines() if " attempt " in line)
    assert seen == [("0", "2", "0"), ("0", "2", "1"), ("0", "2", "2"), ("1", "2", "0"), ("1", "2", "1"),
                    ("1", "2", "2")]
    assert [a.number for a in server.job.verdict().attempts] == [0, 1]
    assert all(p.returncode is not None for p in sessions.procs.values())


def test_head_restarts_exhausted_end_with_the_code_and_every_agent_exits(tmp_path):
    code, out, server, sessions = run_restarting_job(tmp_path, {"FAILS": "99"}, max_restarts=1, min_attempt_s=0.0)
    assert code == 3, out
    assert server.job.verdict().restart_lines[0] == "1 restart(s) exhausted (--max_restarts 1)"
    assert all(p.returncode is not None for p in sessions.procs.values())


def run_logged_job(tmp_path, source, hosts, **request_fields):
    """``source`` as a script at a real head with real agents on ``hosts`` ({host: slots}) and ``--log_dir``; it must
    succeed. Returns the log directory."""
    logs = tmp_path / "logs"
    script = tmp_path / "job.py"
    script.write_text(source)
    request = JobRequest(script=str(script), master_port=0, launch=LaunchOptions(python=sys.executable),
                         cwd=str(tmp_path), **request_fields)
    plan = make_plan(replace(request, options=replace(request.options, log_dir=str(logs))), hosts, "ssh")
    server, sessions, _ = serve(plan)
    assert server.run(sessions, own_signals=False) == 0
    sessions.terminate()
    return logs


def run_flaky_logged_job(tmp_path):
    """FLAKY with ``--max_restarts 2``: it succeeds on attempt 1."""
    return run_logged_job(tmp_path, FLAKY, {"a": (0, 1)}, restart=RestartPolicy(2, 60.0))


def test_head_summary_json_has_the_history(tmp_path):
    logs = run_flaky_logged_job(tmp_path)
    summary = json.loads((logs / "summary.json").read_text())
    assert [a["attempt"] for a in summary["attempts"]] == [0, 1]
    assert summary["attempts"][0]["exit_code"] == 3 and summary["attempts"][1]["root_cause"] is None
    # the head drew it (issue 40 §2): in a real browser, a lane per rank and the restart with its cause
    drawn = open_report(logs / "report.html", tmp_path, "restart")
    assert sorted(drawn.lanes) == ["job", "node 0 (a)", "rank 0 (a)", "rank 1 (a)"]
    cause = "restart after attempt 0: rank 1 (local 1) on a exited with code 3"
    assert cause in drawn.svg_text and cause in drawn.text  # beside its mark, and in the marks' table
