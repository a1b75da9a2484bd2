"""A RankGroup whose ranks are forked from a preload helper (``RankGroup(..., preload=helper)``, issue 32) is
supervised exactly as one whose ranks are started: exit codes and signals, CPU and peak memory, the first failure
stopping the rest, leftovers, the watchdog after ``kill -9`` of the agent, the hang doctor's stacks; and the torch
ranks it forks (slow tests) get their thread count and their own random state, and meet in a gloo all-reduce.

Ranks are tests/procs/rank.py (steps) as in tests/test_supervise.py, with its helpers; every rank carries the
test's marker in its environment, which a forked rank shows on /proc/PID/environ as a started one does.
"""

# ruff: noqa: F811 - the fixtures marker and ready come from tests/test_supervise.py, as parameters here
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

import pytest

from tests.test_supervise import (  # noqa: F401 - marker and ready are fixtures
    RANK_PY,
    Agent,
    hx,
    kill_9_ranks,
    marked,
    marker,
    n_ready,
    rank,
    ready,
    ready_pids,
    wait_for,
)
from xrun.common.result.failure_report import format_failure_report
from xrun.common.spec import AgentOptions
from xrun.launch.doctor.node_doctor import NodeDoctor
from xrun.launch.preload.client import PreloadHelper
from xrun.launch.ranks.processes import RankProcess
from xrun.launch.ranks.supervise import RankGroup, SuperviseOptions

PROCS = os.path.dirname(RANK_PY)
WAIT = 60.0


def helper_for(*modules: str, options: tuple[str, ...] = ()) -> PreloadHelper:
    """A helper for tests/procs/rank.py, which runs without -u (torch's ranks here: with it)."""
    helper = PreloadHelper.start(list(modules) or ["json"], python=sys.executable, options=options,
                                 env=dict(os.environ), cwd=os.getcwd(), path0=PROCS)
    helper.wait_ready(WAIT)
    return helper


@pytest.fixture
def helper():
    helper = helper_for()
    yield helper
    helper.close()


def run_group(procs, helper=None, **options):
    options.setdefault("host", "h")
    return RankGroup(procs, SuperviseOptions(**options), preload=helper).run()


def shape(result):
    """What must not depend on how the ranks were made."""
    return (result.exit_code, None if result.root_cause is None else result.root_cause.rank,
            [(o.rank, o.returncode, o.signal, o.stopped_by_xrun, o.stderr_tail, len(o.leftovers))
             for o in result.outcomes])


def failing_group(marker, ready):
    return [
        rank(0, "ready", ready, "sleep", "60", marker=marker),
        rank(1, "ready", ready, "sleep", "60", marker=marker),
        rank(2, "ready", ready, "sleep", "60", marker=marker),
        rank(3, "wait-ready", f"3@{ready}", "err", hx(b"it broke\n"), "exit", "7", marker=marker),
    ]


def test_the_first_failure_stops_the_rest_as_with_started_ranks(helper, marker, tmp_path, capfd):
    results = []
    for made_by in (None, helper):
        directory = tmp_path / ("forked" if made_by else "started")
        directory.mkdir()
        results.append(run_group(failing_group(marker, str(directory)), made_by))
        assert marked(marker) == []
    started, forked = results
    assert shape(forked) == shape(started)
    assert forked.exit_code == 7 and forked.root_cause.stderr_tail == ("it broke",)
    assert [o.signal for o in forked.outcomes[:3]] == [signal.SIGTERM] * 3
    for outcome in forked.outcomes:  # wait4's accounting: the rank is the agent's child, as a started one is
        assert outcome.cpu_s is not None and outcome.peak_rss_bytes and outcome.peak_rss_bytes > 1 << 20
    assert "stopping 3 ranks" in capfd.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGKILL])
def test_death_by_signal_is_named_as_for_a_started_rank(helper, marker, ready, capfd, signum):
    procs = [rank(0, "ready", ready, "sleep", "60", marker=marker),
             rank(1, "wait-ready", f"1@{ready}", "raise", str(int(signum)), marker=marker)]
    result = run_group(procs, helper)
    assert result.exit_code == 128 + signum and result.root_cause.signal == signum
    assert signal.Signals(signum).name in format_failure_report(result)
    assert marked(marker) == []


def test_leftovers_of_a_forked_rank_are_swept_and_reported(helper, marker, ready, capfd):
    procs = [rank(0, "fork", "ignore", "ready", ready, "then", "-", "wait-ready", f"1@{ready}", "exit", "0",
                  marker=marker)]
    result = run_group(procs, helper, shutdown_timeout=0.5)
    assert result.exit_code == 0 and len(result.outcomes[0].leftovers) == 1
    assert marked(marker) == []


def test_a_rank_the_helper_cannot_fork_is_the_root_cause(helper, marker, capfd):
    procs = [rank(0, "sleep", "60", marker=marker),
             RankProcess(rank=1, local_rank=1, argv=(sys.executable, "-u", RANK_PY, "exit", "0"),
                         env={**os.environ, "XRUN_TEST_MARK": marker})]
    result = run_group(procs, helper)
    assert result.exit_code == 126 and result.root_cause.rank == 1
    assert result.root_cause.stderr_tail[0].startswith("xrun: cannot fork rank 1: its interpreter options -u")
    assert marked(marker) == []


def test_a_killed_helper_is_said_at_once_and_the_running_ranks_go_on(helper, marker, ready, capfd):
    go = os.path.join(ready, "..", "go")
    procs = [rank(n, "ready", ready, "wait-file", go, "exit", "0", marker=marker) for n in range(2)]
    group = RankGroup(procs, SuperviseOptions(host="h"), preload=helper)

    due = [time.monotonic()]

    def kill_helper_once_ready():
        due[0] = time.monotonic() + 0.01
        if n_ready(ready, 2) and not os.path.exists(go):
            os.kill(helper.pid, signal.SIGKILL)
            time.sleep(0.5)  # the loop hears of it before the ranks end
            open(go, "w").close()

    group.plugins.timers.add(lambda: due[0], kill_helper_once_ready)
    result = group.run()
    assert result.exit_code == 0
    err = capfd.readouterr().err
    assert f"the preload helper (pid {helper.pid}) was killed by SIGKILL; the running ranks go on" in err
    assert marked(marker) == []


def test_a_dead_helper_fails_the_ranks_it_has_not_forked(helper, marker, capfd):
    os.kill(helper.pid, signal.SIGKILL)
    helper.lost()
    result = run_group([rank(0, "exit", "0", marker=marker)], helper)
    assert result.exit_code == 126
    assert "the preload helper" in result.root_cause.stderr_tail[0] and "killed by SIGKILL" in result.root_cause.stderr_tail[0]


@pytest.mark.slow
def test_kill_9_of_the_agent_leaves_no_forked_rank_and_no_helper(tmp_path, marker, ready):
    agent = Agent(tmp_path, marker, kill_9_ranks(ready), preload={"modules": ["json"], "path0": PROCS}, shutdown_timeout=1)
    wait_for(lambda: n_ready(ready, 4), "ranks and the grandchild to start")
    helper_pid = int(agent.stderr().split("helper ", 1)[1].split()[0])
    assert len(marked(marker)) == 4
    for pid in ready_pids(ready, "main"):
        with open(f"/proc/{pid}/stat") as f:  # the agent's children, forked not started
            assert int(f.read().rsplit(")", 1)[1].split()[1]) == agent.proc.pid
    agent.proc.kill()
    agent.proc.wait()
    wait_for(lambda: not marked(marker), "every rank and grandchild to die after the agent's SIGKILL")
    wait_for(lambda: not os.path.exists(f"/proc/{helper_pid}") or _zombie(helper_pid), "the helper to die with it")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed")
@pytest.mark.slow
def test_the_hang_doctor_takes_the_stacks_of_forked_ranks(helper, marker, ready, capfd):
    group = RankGroup(failing_group(marker, ready), SuperviseOptions(host="h"), preload=helper)
    doctor = NodeDoctor("h", AgentOptions())
    doctor.attach(group)
    try:
        result = group.run()
    finally:
        doctor.close()
    assert result.exit_code == 7
    stacks = {s.rank: s for s in result.stacks}
    assert sorted(stacks) == [0, 1, 2]
    for stack in stacks.values():
        assert stack.error is None
        assert any(f.filename.endswith("rank.py") and f.name == "main" for f in stack.threads[0].frames)
        outermost = stack.threads[0].frames[0]  # as a started rank's: the helper's frames below it left out
        assert outermost.filename.endswith("rank.py") and outermost.name == "<module>", stack.threads[0].frames


# ---------------------------------------------------------------------------------------------------------------
# torch: four ranks forked from a helper that preloaded it.

TORCH_RANK = """
import json, os, random, sys
import numpy, torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

class Draws(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.rand(1).item(), float(numpy.random.random()), os.getpid()

dist.init_process_group("gloo")
x = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(x)
workers = [[t.item() for t in batch] for batch in DataLoader(Draws(), batch_size=1, num_workers=2)]
print(json.dumps({"rank": dist.get_rank(), "sum": x.item(), "threads": torch.get_num_threads(),
                  "draws": [random.random(), float(numpy.random.random()), torch.rand(1).item()],
                  "seed": torch.initial_seed(), "workers": workers, "cuda_bad_fork": torch.cuda._is_in_bad_fork(),
                  "preloaded": "torch" in sys.modules}), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.torch
def test_four_torch_ranks_forked_from_a_torch_helper_meet_in_gloo(tmp_path, marker, capfd):
    pytest.importorskip("torch")
    script = tmp_path / "torch_rank.py"
    script.write_text(TORCH_RANK)
    from xrun.net import free_port

    port = str(free_port("127.0.0.1"))
    helper = helper_for("torch", "numpy", options=("-u",))
    try:
        procs = [
            RankProcess(rank=r, local_rank=r, argv=(sys.executable, "-u", str(script)), cwd=str(tmp_path),
                        env={**os.environ, "XRUN_TEST_MARK": marker, "RANK": str(r), "LOCAL_RANK": str(r),
                             "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                             "OMP_NUM_THREADS": str(1 + r % 2)})
            for r in range(4)
        ]
        result = run_group(procs, helper, prefix=False)
    finally:
        helper.close()
    out, err = capfd.readouterr()
    assert result.exit_code == 0, err
    reports = sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")), key=lambda r: r["rank"])
    assert [r["sum"] for r in reports] == [10.0] * 4
    assert [r["threads"] for r in reports] == [1, 2, 1, 2]  # each its own OMP_NUM_THREADS
    for i in range(3):  # python's, numpy's and torch's global generators: each rank its own
        assert len({r["draws"][i] for r in reports}) == 4
    assert len({r["seed"] for r in reports}) == 4
    workers = [w for r in reports for w in r["workers"]]
    assert len({w[0] for w in workers}) == len(workers)  # DataLoader workers draw from their own rank's seed
    assert len({w[2] for w in workers}) >= 8  # two worker processes per rank did the work
    assert not any(r["cuda_bad_fork"] for r in reports)
    assert marked(marker) == []
