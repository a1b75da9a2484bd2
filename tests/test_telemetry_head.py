"""The head's side of the ranks' collective records (issue 31): the hang doctor's view with the collective the
ranks wait in, the report before a stop, and real gloo jobs: a rank that never enters an all-reduce (the root
cause names it, locally and over the control channel) and a rank that sleeps before each collective (named a
straggler, its score in summary.json).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.cluster.harness import processes_with_marker
from tests.headserver import endpoint_of, head_server
from tests.report_browser import open_report
from tests.test_control import LocalSessions
from tests.test_frtrace import torchfrtrace
from tests.test_hang_doctor import start_xrun
from xrun.channel import STOP_STACKS, Kind, message
from xrun.common.output.status import STRAGGLERS_EVERY, PlainStatus
from xrun.common.rankplan import LaunchOptions
from xrun.common.result.outcome import HANG_EXIT
from xrun.common.result.stacks import RankStack
from xrun.common.spec import AgentOptions, HangAction
from xrun.common.telemetry.records import Collective, CollectivesReport, GroupState, RankCollectives
from xrun.common.telemetry.records import collectives_message as wire
from xrun.runner.job.doctor import HeadDoctor, Show
from xrun.runner.plan import JobRequest, make_plan


def record(rank: int, last: int, *, waiting: bool, host: str = "a", where: str | None = None) -> RankCollectives:
    recent = tuple(Collective(s, "all_reduce", ((4096,),), ("Float",), ((4096,),), ("Float",), "scheduled",
                              not (waiting and s == last), 1) for s in range(1, last + 1))
    return RankCollectives(host, rank, (GroupState("0", "default_pg", recent),), where=where)


HUNG = (record(0, 2, waiting=True), record(1, 2, waiting=True, host="b"),
        record(2, 1, waiting=False, host="c", where="train.py:88 evaluate"))
ROOT_LINE = ("all_reduce #2 on the default group ([4096] float32): ranks 0-1 wait in it; rank 2 (c) never entered — "
             "at train.py:88 evaluate")


def test_the_head_dump_shows_the_collective_held_after_the_stacks(tmp_path):
    doctor = HeadDoctor(("a", "b", "c").__getitem__, hang_timeout=None, hang_action=HangAction.DUMP,
                        log_dir=str(tmp_path), world_size=3)
    doctor.want("SIGQUIT", [0, 1, 2], now=0.0)
    for node, rec in enumerate(HUNG):  # each node's collectives, then its stacks (the order they travel in)
        doctor.collectives(node, wire(CollectivesReport(1, (rec,), file=f"/logs/xrun-collectives-{node}.json")))
        steps = doctor.stacks(node, message(Kind.STACKS, id=1, stacks=[RankStack(rec.host, node, 0, 9).to_json()],
                                            problem=None), now=1.0)
    [show] = steps
    assert isinstance(show, Show)
    at = show.lines.index("collectives of 3 rank(s) (torch's Flight Recorder), the root cause first:")
    assert show.lines[at + 1 :] == (f"  {ROOT_LINE}", "  full records: a:/logs/xrun-collectives-0.json",
                                    "  full records: b:/logs/xrun-collectives-1.json",
                                    "  full records: c:/logs/xrun-collectives-2.json")
    assert doctor.findings is not None and doctor.findings.root_cause == ROOT_LINE
    # a hang stopped without stacks: the job's report still names the collective held
    assert doctor.stop_stack_lines() == [f"the collective held at the hang: {ROOT_LINE}"]


def test_records_from_before_the_stop_join_the_report_and_late_or_foreign_ones_are_ignored():
    doctor = HeadDoctor(("a", "b", "c").__getitem__, hang_timeout=None, hang_action=HangAction.DUMP,
                        log_dir=None, world_size=3)
    doctor.collectives(0, wire(CollectivesReport(7, HUNG)))  # no dump 7 is being collected
    assert doctor.stop_stack_lines() == [] and doctor.findings is None
    doctor.collectives(0, wire(CollectivesReport(STOP_STACKS, HUNG[:2])))
    doctor.collectives(2, wire(CollectivesReport(STOP_STACKS, HUNG[2:])))
    assert doctor.stop_stack_lines() == ["collectives of 3 rank(s) (torch's Flight Recorder), the root cause first:",
                                         f"  {ROOT_LINE}"]


def test_a_malformed_collectives_message_is_a_protocol_error():
    doctor = HeadDoctor(("a",).__getitem__, hang_timeout=None, hang_action=HangAction.DUMP, log_dir=None)
    with pytest.raises(ValueError):
        doctor.collectives(0, message(Kind.COLLECTIVES, id=1, ranks=[{"rank": "x"}]))


# -- real gloo jobs ----------------------------------------------------------------------------------------------

GLOO_SKIP = """
import os, time
print("starting", flush=True)
import torch
import torch.distributed as dist

def evaluate():
    time.sleep(300)

dist.init_process_group("gloo")
rank = dist.get_rank()
tensor = torch.ones(4096)
dist.all_reduce(tensor)
print("step 1 done", flush=True)
if rank == int(os.environ["SKIP_RANK"]):
    evaluate()
dist.all_reduce(tensor)
"""

GLOO_SLOW = """
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
tensor = torch.ones(1024)
for step in range(int(os.environ["STEPS"])):
    if rank == int(os.environ["SLOW_RANK"]):
        time.sleep(0.15)
    dist.all_reduce(tensor)
print("done", flush=True)
"""


def run_gloo_over_channel(tmp_path, script, *, env, options, status=None):
    """Four gloo ranks on three agents over the control channel (nodes a: ranks 0-1, b: 2, c: 3)."""
    path = tmp_path / "job.py"
    path.write_text(script)
    options = AgentOptions(log_dir=str(tmp_path / "logs"), **options)
    request = JobRequest(script=str(path), master_addr="127.0.0.1", master_port=0,
                         launch=LaunchOptions(python=sys.executable), env=env, cwd=str(tmp_path), options=options)
    plan = make_plan(request, {"a": (0, 1), "b": (0,), "c": (0,)}, "ssh")
    server = head_server(plan, join_timeout=60, status=status or PlainStatus(3))
    port = server.listen(["127.0.0.1"])
    sessions = LocalSessions(plan, endpoint_of(server, port))
    try:
        code = server.run(sessions)
    finally:
        sessions.terminate()
    return code, {h: out.decode() for h, out in sessions.output.items()}


@pytest.mark.slow
@pytest.mark.torch
def test_a_rank_that_never_enters_the_all_reduce_is_the_root_cause_over_the_channel(tmp_path, capsys):
    pytest.importorskip("torch")
    code, outputs = run_gloo_over_channel(tmp_path, GLOO_SKIP, env={"SKIP_RANK": "3"},
                                          options={"hang_timeout": 20.0, "hang_action": HangAction.STOP})
    err = capsys.readouterr().err
    assert code == HANG_EXIT, (err, outputs)
    root = ("all_reduce #2 on the default group ([4096] float32): ranks 0-2 wait in it; rank 3 (c) never entered — "
            "at job.py:8 evaluate")
    assert f"xrun:   {root}" in err.splitlines(), err  # the dump's view
    assert f"xrun: the collective held at the hang: {root}" in err.splitlines()  # the job's last words
    failure = json.loads((tmp_path / "logs" / "failure.json").read_text())
    findings = failure["collectives"]["findings"]
    assert failure["exit_code"] == HANG_EXIT and findings["root_cause"] == root
    assert findings["stuck"][0]["absent"][0]["where"] == "job.py:8 evaluate"
    assert len(failure["collectives"]["files"]) == 3  # each node's full records, "host:path"


@pytest.mark.slow
@pytest.mark.torch
def test_a_rank_that_never_enters_the_all_reduce_is_the_root_cause_of_a_local_job(tmp_path):
    err, failure = hang_of_a_local_job(tmp_path, 4, {"SKIP_RANK": "2"}, GLOO_SKIP)
    root = ("all_reduce #2 on the default group ([4096] float32): ranks 0-1, 3 wait in it; rank 2 (localhost) never "
            "entered — at job.py:8 evaluate")
    assert f"xrun:   {root}" in err.splitlines(), err  # the hang's view (the head's, as for several nodes)
    assert f"    {root}" in err.splitlines()  # the node's failure report
    assert failure["collectives"]["findings"]["root_cause"] == root and failure["collectives"]["file"]
    # torch's own analyser reads the same dumps and names the same rank and collective (issue 40 §4)
    folder = failure["collectives"]["torchfrtrace"]
    assert folder == failure["collectives"]["file"].removesuffix(".json") and f"torchfrtrace reads {folder}" in err
    said = torchfrtrace(folder)
    assert "sequence number: 2" in said and "collective: gloo:all_reduce" in said, said
    assert "missing ranks: {2}" in said, said


def hang_of_a_local_job(tmp_path, nproc, env, script):
    """A local gloo job of ``nproc`` ranks stopped at --hang_timeout 20: its stderr and failure.json (nothing left)."""
    pytest.importorskip("torch")
    proc, marker = start_xrun(tmp_path, "--num_gpus", str(nproc), "--master_port", "0", "--hang_timeout", "20",
                              "--hang_action", "stop", env=env, script=script)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == HANG_EXIT, err
    assert not processes_with_marker(f"XRUN_TEST_MARKER={marker}")
    return err, json.loads((tmp_path / "logs" / "localhost" / "failure.json").read_text())


@pytest.mark.slow
@pytest.mark.torch
def test_a_rank_that_sleeps_before_each_collective_is_named_a_straggler(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("XRUN_SAMPLE_EVERY_S", "3")  # the record's samples (lateness, CPU, RSS) for report.html
    status = PlainStatus(3)
    code, outputs = run_gloo_over_channel(tmp_path, GLOO_SLOW, env={"SLOW_RANK": "3", "STEPS": "260"}, options={},
                                          status=status)
    err = capsys.readouterr().err
    assert code == 0, (err, outputs)
    [named] = [line for line in err.splitlines() if "straggler: rank" in line]
    assert named.startswith("xrun: straggler: rank 3 (c) enters collectives ") and "(others wait for it)" in named
    late_ms = float(named.split("enters collectives ")[1].split(" ms")[0])
    assert 100 <= late_ms <= 400, named
    # the live status holds it to the end (the job stays slow): the rank, its node and its lateness
    assert status.stragglers_now is not None and status.stragglers_now.startswith("straggler: rank 3 (c) +"), status
    assert 100 <= float(status.stragglers_now.split("+")[1].split(" ms")[0]) <= 400
    scores = {s["rank"]: s for s in json.loads((tmp_path / "logs" / "summary.json").read_text())["stragglers"]
              ["ranks"]}
    assert scores[3]["straggler"] and scores[3]["late_share"] >= 0.75
    assert not any(scores[r]["straggler"] for r in (0, 1, 2)), scores
    # on time but for the machine's own jitter (a 10 ms preemption on 2 loaded cores makes a rank late now and
    # then: the rule reads shares for that reason)
    assert all(scores[r]["late_share"] < 0.25 for r in (0, 1, 2)), scores
    # report.html (issue 40 §2) in a real browser: a lane per rank, the straggler's rank marked on its lane and
    # drawn late in the lateness chart, whose values the page's text holds too
    drawn = open_report(tmp_path / "logs" / "report.html", tmp_path, "straggler")
    assert sorted(drawn.lanes) == ["job", "node 0 (a)", "node 1 (b)", "node 2 (c)", "rank 0 (a)", "rank 1 (a)",
                                   "rank 2 (b)", "rank 3 (c)"]
    assert "straggler: rank 3 (c) +" in drawn.svg_text and "straggler: rank 3 (c) +" in drawn.text
    assert "rank 3 (ms)" in drawn.text and "rank 3" in drawn.svg_text  # the lateness chart's line and its table


def test_the_live_status_says_the_stragglers_again_while_they_last_and_forgets_them_once_recovered(capsys):
    status = PlainStatus(3)
    status.line("straggler: rank 5 (node3) enters collectives 210 ms after ...")  # StragglerScores.add's line
    status.stragglers("straggler: rank 5 (node3) +210 ms", 100.0)
    status.stragglers("straggler: rank 5 (node3) +210 ms", 100.0 + STRAGGLERS_EVERY - 1)
    assert status.stragglers_now == "straggler: rank 5 (node3) +210 ms"
    status.stragglers("straggler: rank 5 (node3) +215 ms", 100.0 + STRAGGLERS_EVERY)
    status.stragglers("straggler: rank 5 (node3) +215 ms", 100.0 + STRAGGLERS_EVERY + 10)
    assert capsys.readouterr().err.splitlines()[1:] == ["xrun: straggler: rank 5 (node3) +215 ms (still)"]
    status.stragglers(None, 100.0 + 3 * STRAGGLERS_EVERY)
    status.stragglers("straggler: rank 2 (node1) +50 ms", 100.0 + 3 * STRAGGLERS_EVERY + 1)  # named anew: its line
    assert status.stragglers_now == "straggler: rank 2 (node1) +50 ms" and capsys.readouterr().err == ""


@pytest.mark.slow
@pytest.mark.torch
def test_a_healthy_job_is_scored_and_names_no_straggler(tmp_path, capsys):
    pytest.importorskip("torch")
    healthy = GLOO_SLOW.replace("dist.all_reduce(tensor)", "dist.all_reduce(tensor); time.sleep(0.05)")
    code, outputs = run_gloo_over_channel(tmp_path, healthy, env={"SLOW_RANK": "-1", "STEPS": "500"}, options={})
    err = capsys.readouterr().err
    assert code == 0, (err, outputs)
    assert "straggler" not in err
    scores = json.loads((tmp_path / "logs" / "summary.json").read_text())["stragglers"]["ranks"]
    assert len(scores) == 4 and all(s["scored"] >= 12 and not s["straggler"] for s in scores), scores


@pytest.mark.slow
@pytest.mark.torch
def test_a_local_job_names_its_straggler(tmp_path):
    pytest.importorskip("torch")
    proc, marker = start_xrun(tmp_path, "--num_gpus", "3", "--master_port", "0",
                              env={"SLOW_RANK": "1", "STEPS": "260"}, script=GLOO_SLOW)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    [named] = [line for line in err.splitlines() if "straggler: rank" in line]
    assert named.startswith("xrun[localhost]: straggler: rank 1 (localhost) enters collectives "), named
    assert not processes_with_marker(f"XRUN_TEST_MARKER={marker}")
    # the job's summary.json has the section a connected job's has (issue 38): every rank scored, rank 1 named
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["end"] is None, summary
    stragglers = summary["stragglers"]
    assert set(stragglers) == {"late_floor_ms", "collectives_scored", "ranks"}, stragglers
    scores = {s["rank"]: s for s in stragglers["ranks"]}
    assert sorted(scores) == [0, 1, 2] and {s["host"] for s in scores.values()} == {"localhost"}, scores
    assert scores[1]["straggler"] and not scores[0]["straggler"] and not scores[2]["straggler"], scores


GLOO_MISMATCH = """
import os
print("starting", flush=True)
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
tensor = torch.ones(4096)
dist.all_reduce(tensor)
print("step 1 done", flush=True)
if rank == int(os.environ["BARRIER_RANK"]):
    dist.barrier()
else:
    dist.all_reduce(tensor)
"""


@pytest.mark.slow
@pytest.mark.torch
def test_a_rank_in_a_barrier_where_the_others_all_reduce_is_a_mismatch(tmp_path):
    err, failure = hang_of_a_local_job(tmp_path, 3, {"BARRIER_RANK": "1"}, GLOO_MISMATCH)
    root = "#2 on the default group: ranks in different collectives: ranks 0, 2 in all_reduce ([4096] float32), rank 1 in barrier"
    assert f"xrun:   {root}" in err.splitlines(), err
    [mismatch] = failure["collectives"]["findings"]["mismatches"]
    assert mismatch["kind"] == "op" and mismatch["seq"] == 2
