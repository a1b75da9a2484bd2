"""The hang doctor across real hosts (issue 14): 3 network-namespace nodes x 2 ranks, ssh and pdsh.

SIGQUIT to xrun merges the stacks of all six ranks, taken by each node's agent, into one view at the head;
a rank that fails on one node brings every node's stacks into its failure report and, merged, into the head's. The job fixture
(tests/cluster/test_multinode.py) marks every rank by environment and checks that nothing is left behind.
"""

from __future__ import annotations

import json
import shutil
import signal
import time

import pytest

from tests.cluster.jobs import read_lines, wait_for
from tests.cluster.test_multinode import BACKENDS, job  # noqa: F401  (job: the fixture these tests use)
from tests.test_frtrace import torchfrtrace
from tests.test_telemetry_ranks import SKIPS_ONE
from xrun.common.telemetry.records import rank_collectives, where_from_traceback

SCRIPT = """
import os, time
def load_batch():
    time.sleep(60)
def all_reduce():
    time.sleep(60)
print("rank", os.environ["RANK"], "up", flush=True)
if os.environ["RANK"] == os.environ.get("SLOW_RANK"):
    load_batch()
elif os.environ["RANK"] == os.environ.get("FAIL_RANK"):
    time.sleep(2.0)
    raise SystemExit(3)
else:
    all_reduce()
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sigquit_merges_every_nodes_stacks_at_the_head(job, backend):  # noqa: F811
    script = job.tmp / "job.py"
    script.write_text(SCRIPT)
    proc = job.start(backend, "--log_dir", str(job.tmp / "logs"), script_path=script, env={"SLOW_RANK": "3"})
    out: list[str] = []
    err: list[str] = []
    read_lines(proc.stdout, out)
    read_lines(proc.stderr, err)
    wait_for(out, lambda _: sum(" up" in x for x in out) >= 6, "6 ranks up", 60, proc=proc, err=err)
    started = time.monotonic()
    proc.send_signal(signal.SIGQUIT)
    wait_for(err, lambda line: "ranks 0-2, 4-5: " in line, "merged view", 20, proc=proc, err=out)
    node1 = job.cluster.nodes[1].name
    assert f"xrun:   rank 3 ({node1}, local 1): job.py:4 load_batch\n" in err
    assert "xrun:   ranks 0-2, 4-5: job.py:6 all_reduce\n" in err
    headline = next(line for line in err if "SIGQUIT: stacks of 6 ranks" in line)
    assert str(job.tmp / "logs") in headline
    assert proc.poll() is None, "the job goes on after a dump"
    print(f"SIGQUIT to the merged view across 3 nodes: {time.monotonic() - started:.2f} s")
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert proc.returncode == 130
    job.assert_clean()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failure_brings_the_other_nodes_stacks_into_their_reports(job, backend):  # noqa: F811
    script = job.tmp / "job.py"
    script.write_text(SCRIPT)
    code, _, err = job.run(backend, script_path=script, env={"FAIL_RANK": "5", "SLOW_RANK": "3"}, timeout=90)
    assert code == 3, err
    lines = err.splitlines()
    node1 = job.cluster.nodes[1].name
    # each node's report (relayed to the head's stderr, possibly prefixed by the backend) has its own survivors
    assert any(line.endswith(" ranks 0-1: job.py:6 all_reduce") for line in lines), err
    assert any(line.endswith(f" rank 3 ({node1}, local 1): job.py:4 load_batch") for line in lines), err
    at = lines.index("xrun: stacks of 5 rank(s) taken before the stop, outliers first:")  # the head's, merged
    assert lines[at + 1 : at + 3] == [f"xrun:   rank 3 ({node1}, local 1): job.py:4 load_batch",
                                      "xrun:   ranks 0-2, 4: job.py:6 all_reduce"]
    job.assert_clean()



@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hang_reads_every_nodes_collectives(job, backend, python):  # noqa: F811
    """Issue 31 across hosts: 6 gloo ranks on 3 nodes, rank 3 (node2) never enters the 6th all-reduce. At the
    hang each node's agent reads its ranks' Flight Recorders and stacks through their sockets and keeps them in
    a file of its own (the summaries go to the head, whose view is the head's part): every rank's last
    collective and where rank 3 is. (``--python``: the nodes run this tree's agent.)"""
    pytest.importorskip("torch")
    script = job.tmp / "job.py"
    script.write_text(SKIPS_ONE)
    logs = job.tmp / "logs"
    # GLOO_*/TORCH_* travel by prefix, LATE_RANK with --export
    env = {"GLOO_SOCKET_IFNAME": "xceth0", "TORCH_CPP_LOG_LEVEL": "ERROR", "LATE_RANK": "3"}
    code, out, err = job.run(backend, "--python", python, "--master_port", "0", "--hang_timeout", "10",
                             "--hang_action", "stop", "--log_dir", str(logs), env=env, script_path=script,
                             timeout=180)
    assert code == 124, err
    assert "WorkerServer" not in out + err
    last, hosts = {}, set()
    for path in logs.glob("xrun-collectives-*.json"):
        full = json.loads(path.read_text())
        hosts.add(full["host"])
        for rank, answers in full["ranks"].items():
            record = rank_collectives(full["host"], int(rank), answers["flight_recorder"],
                                      where=where_from_traceback(answers["traceback"]))
            last[int(rank)] = (record.groups[0].recent[-1].seq, record.where)
    assert hosts == {node.name for node in job.cluster.nodes}
    assert sorted(last) == list(range(6)), last
    assert last[3] == (5, "job.py:7 evaluate")
    assert all(last[r] == (6, "job.py:19 <module>") for r in (0, 1, 2, 4, 5)), last
    # each node's dumps for torch's analyser, put into one folder, are read as one job's (issue 40 §4)
    together = job.tmp / "frtrace"
    together.mkdir()
    for folder in logs.glob("xrun-collectives-*"):
        if folder.is_dir():
            for dump in folder.iterdir():
                shutil.copy(dump, together / dump.name)
    assert sorted(p.name for p in together.iterdir()) == [f"rank_{r}" for r in range(6)]
    said = torchfrtrace(str(together))
    assert "sequence number: 6" in said and "missing ranks: {3}" in said, said
    job.assert_clean()
