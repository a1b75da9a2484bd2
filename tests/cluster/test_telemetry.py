"""Collective telemetry across real hosts (issue 31): 3 network-namespace nodes x 2 gloo ranks over ssh, this
tree's agent on the nodes (``--python``).

A rank that never enters an all-reduce is the hang's root cause, named with its node; a rank that sleeps before
each collective is named a straggler with its node, its clock put on the head's by the pings (every node has its
own agent, its own pongs).
"""

from __future__ import annotations

import json

import pytest

from tests.cluster.test_multinode import job  # noqa: F401  (job: the fixture these tests use)
from tests.test_telemetry_head import GLOO_SKIP, GLOO_SLOW
from xrun.launch.result.outcome import HANG_EXIT


@pytest.mark.slow
def test_the_rank_that_never_entered_is_named_across_nodes(job, python):  # noqa: F811
    script = job.tmp / "job.py"
    script.write_text(GLOO_SKIP)
    code, _, err = job.run("ssh", "--python", python, "--hang_timeout", "25", "--hang_action", "stop", "--log_dir", str(job.tmp / "logs"),
                           script_path=script, env={"SKIP_RANK": "3"}, timeout=180)
    assert code == HANG_EXIT, err
    node = job.cluster.nodes[1].name
    root = (f"all_reduce #2 on the default group ([4096] float32): ranks 0-2, 4-5 wait in it; rank 3 ({node}) never "
            "entered — at job.py:8 evaluate")
    assert f"xrun:   {root}" in err.splitlines(), err
    failure = json.loads((job.tmp / "logs" / "failure.json").read_text())
    assert failure["collectives"]["findings"]["root_cause"] == root
    job.assert_clean()


@pytest.mark.slow
def test_a_slow_rank_is_named_a_straggler_across_nodes(job, python):  # noqa: F811
    script = job.tmp / "job.py"
    script.write_text(GLOO_SLOW)
    code, _, err = job.run("ssh", "--python", python, "--log_dir", str(job.tmp / "logs"), script_path=script,
                           env={"SLOW_RANK": "5", "STEPS": "300"}, timeout=240)
    assert code == 0, err
    node = job.cluster.nodes[2].name
    assert any(line.startswith(f"xrun: straggler: rank 5 ({node}) enters collectives ") for line in err.splitlines()), err
    scores = json.loads((job.tmp / "logs" / "summary.json").read_text())["stragglers"]["ranks"]
    assert [s["rank"] for s in scores if s["straggler"]] == [5], scores
    job.assert_clean()
