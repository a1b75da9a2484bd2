"""The failure report and its JSON twin, from literal results."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

from xrun.common.output.logfiles import open_logs
from xrun.common.result.failure_report import conclude, failure_json, format_failure_report, write_failure_json
from xrun.common.result.outcome import NodeResult, RankOutcome, describe_status


def outcome(rank: int, **kw) -> RankOutcome:
    fields = dict(
        host="node1",
        rank=rank,
        local_rank=rank % 4,
        pid=1000 + rank,
        returncode=0,
        signal=None,
        runtime_s=12.5,
        stderr_tail=(),
        stopped_by_xrun=False,
    )
    fields.update(kw)
    return RankOutcome(**fields)


def segv_result() -> NodeResult:
    root = outcome(5, returncode=None, signal=signal.SIGSEGV, stderr_tail=("loading shard 3", "Fatal Python error"))
    stopped = outcome(4, returncode=None, signal=signal.SIGTERM, stopped_by_xrun=True, runtime_s=12.51)
    ok = outcome(6)
    return NodeResult(host="node1", outcomes=(stopped, root, ok), root_cause=root, interrupted_by=None, exit_code=139)


def test_report_leads_with_the_root_cause_and_names_the_signal():
    text = format_failure_report(segv_result())
    lines = text.splitlines()
    assert lines[0] == "xrun: node node1: rank 5 failed first: signal SIGSEGV (11) after 12.50 s (exit code 139)"
    assert lines[1].split() == "root cause rank 5 (local 1, pid 1005) signal SIGSEGV (11) 12.50 s".split()
    assert lines[2].split() == "stopped rank 4 (local 0, pid 1004) signal SIGTERM (15) 12.51 s".split()
    assert lines[3].strip() == "1 rank exited with code 0"
    assert lines[-2:] == ["    | loading shard 3", "    | Fatal Python error"]


def test_report_for_an_interrupted_node():
    ranks = tuple(outcome(r, returncode=None, signal=signal.SIGTERM, stopped_by_xrun=True) for r in range(2))
    result = NodeResult(host="n", outcomes=ranks, root_cause=None, interrupted_by=signal.SIGINT, exit_code=130)
    text = format_failure_report(result)
    assert text.splitlines()[0] == "xrun: node n: stopped by SIGINT (exit code 130)"
    assert text.count("stopped     rank") == 2


def test_report_mentions_leftovers_and_exit_code_zero():
    ranks = (outcome(0, leftovers=(4242, 4243)), outcome(1))
    result = NodeResult(host="n", outcomes=ranks, root_cause=None, interrupted_by=None, exit_code=0)
    text = format_failure_report(result)
    assert "2 leftover process(es)" in text.splitlines()[0]
    assert "leftovers stopped: 4242, 4243" in text


def test_report_with_a_root_cause_that_wrote_nothing():
    root = outcome(0, returncode=3)
    result = NodeResult(host="n", outcomes=(root,), root_cause=root, interrupted_by=None, exit_code=3)
    assert format_failure_report(result).splitlines()[-1] == "  rank 0 wrote nothing to stderr"


def test_describe_status_covers_every_shape():
    assert describe_status(outcome(0, returncode=7)) == "exit code 7"
    assert describe_status(outcome(0, returncode=None, signal=9)) == "signal SIGKILL (9)"
    assert describe_status(outcome(0, returncode=None, signal=99)) == "signal signal 99 (99)"
    assert describe_status(outcome(0, returncode=None, pid=0)) == "not started"
    assert describe_status(outcome(0, returncode=None)) == "status unknown"


def test_failure_json_carries_the_same_facts():
    data = failure_json(segv_result())
    assert json.loads(json.dumps(data)) == data
    assert data["host"] == "node1" and data["exit_code"] == 139 and data["root_cause"] == 5
    assert data["interrupted_by"] is None
    assert [r["rank"] for r in data["ranks"]] == [4, 5, 6]
    root = data["ranks"][1]
    assert root["signal"] == {"number": 11, "name": "SIGSEGV"}
    assert root["root_cause"] is True and root["failed"] is True and root["exit_code"] is None
    assert root["stderr_tail"] == ["loading shard 3", "Fatal Python error"]
    assert data["ranks"][0]["stopped_by_xrun"] is True and data["ranks"][0]["root_cause"] is False


def test_failure_and_summary_go_to_the_folder_of_the_nodes_logs(tmp_path, capsys):
    # A host name with a path separator: the rank logs were under "a_b", failure.json under "a/b" (issue 25 §5).
    result = dataclasses.replace(segv_result(), host="a/b")
    fds = open_logs(str(tmp_path), "a/b", 5)
    for fd in fds:
        os.close(fd)
    conclude(result, str(tmp_path), announce=False)
    capsys.readouterr()
    assert sorted(os.listdir(tmp_path)) == ["a_b"]
    assert sorted(os.listdir(tmp_path / "a_b")) == ["failure.json", "rank5", "summary.json"]
    assert json.loads((tmp_path / "a_b" / "failure.json").read_text())["exit_code"] == 139


def test_write_failure_json_creates_directories_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "logs" / "node1" / "failure.json"
    write_failure_json(str(path), segv_result())
    assert json.loads(path.read_text()) == failure_json(segv_result())
    assert os.listdir(path.parent) == ["failure.json"]
