"""Slurm allocation discovery from literal environments (what salloc/sbatch set)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import run_xrun
from xrun.runner.hosts.slurm_alloc import (
    Allocation,
    SlurmAllocationError,
    allocation_hosts,
    allocation_slots,
    discover_allocation,
    expand_counts,
    gpus_per_node,
    in_allocation,
)
from xrun.strict_numbers import MAX_RANKS


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("1", [1]),
        ("2(x3)", [2, 2, 2]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("4,2(x2),8", [4, 2, 2, 8]),
        (" 3 (x2) ", [3, 3]),
    ],
)
def test_expand_counts(text, counts):
    assert expand_counts(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(3)", "2(x)", "2(x3", "-1", "2,,1"])
def test_expand_counts_rejects(text):
    with pytest.raises(SlurmAllocationError) as err:
        expand_counts(text)
    assert "SLURM_TASKS_PER_NODE=" in str(err.value)


@pytest.mark.parametrize(("text", "count"), [("2", 2), ("a100:2", 2), ("a100:2,v100:1", 3), ("gpu:8", 8)])
def test_gpus_per_node(text, count):
    assert gpus_per_node(text) == count


def test_gpus_per_node_rejects():
    with pytest.raises(SlurmAllocationError, match="is not \\[TYPE:\\]COUNT"):
        gpus_per_node("a100")


def test_in_allocation():
    assert in_allocation({"SLURM_JOB_ID": "42"})
    assert not in_allocation({})
    assert not in_allocation({"SLURM_JOB_ID": " "})


def test_hosts_expand_ranges_and_lists_in_order():
    env = {"SLURM_JOB_NODELIST": "node[01-03,07],gpu-a[1-2]"}
    assert allocation_hosts(env) == ("node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2")


def test_hosts_fall_back_to_old_variable():
    assert allocation_hosts({"SLURM_NODELIST": "n[1-2]"}) == ("n1", "n2")


def test_hosts_errors_name_the_variable():
    with pytest.raises(SlurmAllocationError, match=r"SLURM_JOB_NODELIST='node\[1-': "):
        allocation_hosts({"SLURM_JOB_NODELIST": "node[1-"})
    with pytest.raises(SlurmAllocationError, match="not set although SLURM_JOB_ID is"):
        allocation_hosts({})
    with pytest.raises(SlurmAllocationError, match="twice"):
        allocation_hosts({"SLURM_JOB_NODELIST": "a,a"})


@pytest.mark.parametrize(
    ("env", "slots", "source"),
    [
        ({"SLURM_GPUS_PER_NODE": "gpu:4", "SLURM_TASKS_PER_NODE": "1(x3)"}, (4, 4, 4), "SLURM_GPUS_PER_NODE"),
        ({"SLURM_JOB_GPUS": "0,1", "SLURM_TASKS_PER_NODE": "1(x3)"}, (2, 2, 2), "SLURM_JOB_GPUS"),
        ({"SLURM_JOB_GPUS": "0-3"}, (4, 4, 4), "SLURM_JOB_GPUS"),
        ({"SLURM_GPUS_ON_NODE": "8"}, (8, 8, 8), "SLURM_GPUS_ON_NODE"),
        ({"SLURM_GPUS_ON_NODE": "0", "SLURM_TASKS_PER_NODE": "2(x2),1"}, (2, 2, 1), "SLURM_TASKS_PER_NODE"),
        ({"SLURM_TASKS_PER_NODE": "2(x2),1"}, (2, 2, 1), "SLURM_TASKS_PER_NODE"),
    ],
)
def test_slots_prefer_gpus_then_tasks(env, slots, source):
    assert allocation_slots(env, 3) == (slots, source)


def test_slots_default_to_one_per_node():
    slots, source = allocation_slots({}, 2)
    assert slots == (1, 1)
    assert "one slot per node" in source


def test_task_counts_must_match_the_nodes():
    with pytest.raises(SlurmAllocationError, match="lists 2 node\\(s\\) but the allocation has 3"):
        allocation_slots({"SLURM_TASKS_PER_NODE": "2(x2)"}, 3)


def test_discover_allocation():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[1-2],cpu1", "SLURM_TASKS_PER_NODE": "2(x2),1"}
    allocation = discover_allocation(env)
    assert allocation == Allocation(
        job_id="7", hosts=("gpu1", "gpu2", "cpu1"), slots=(2, 2, 1), source="SLURM_TASKS_PER_NODE"
    )
    assert allocation.pool() == {"gpu1": (0, 1), "gpu2": (0, 1), "cpu1": (0,)}
    assert allocation.describe() == (
        "xrun: using Slurm allocation 7: 3 node(s), 5 slot(s) from SLURM_TASKS_PER_NODE"
    )


def test_discover_refuses_to_run_as_one_of_many_srun_tasks():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"}
    with pytest.raises(SlurmAllocationError, match="run it once"):
        discover_allocation(env)


def test_discover_allows_a_single_task_step():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}
    assert discover_allocation(env).hosts == ("n1",)


# -- every count is bounded before it is expanded (issue 25): one line naming the variable, never a MemoryError --

HUGE_ROWS = {
    "tasks-per-node": ({"SLURM_TASKS_PER_NODE": "99999999999(x99999999999)"}, "SLURM_TASKS_PER_NODE"),
    "tasks-repeat": ({"SLURM_TASKS_PER_NODE": "1(x99999999999)"}, "SLURM_TASKS_PER_NODE"),
    "tasks-unicode": ({"SLURM_TASKS_PER_NODE": "\u0663"}, "SLURM_TASKS_PER_NODE"),
    "gpus-per-node": ({"SLURM_GPUS_PER_NODE": "a100:99999999999"}, "SLURM_GPUS_PER_NODE"),
    "gpus-per-node-sum": ({"SLURM_GPUS_PER_NODE": "a:1000,b:1000"}, "SLURM_GPUS_PER_NODE"),
    "gpus-superscript": ({"SLURM_GPUS_PER_NODE": "\u00b2"}, "SLURM_GPUS_PER_NODE"),
    "job-gpus-range": ({"SLURM_JOB_GPUS": "0-99999999999"}, "SLURM_JOB_GPUS"),
    "job-gpus-down": ({"SLURM_JOB_GPUS": "5-1"}, "SLURM_JOB_GPUS"),
    "gpus-on-node": ({"SLURM_GPUS_ON_NODE": "99999999999"}, "SLURM_GPUS_ON_NODE"),
    "nodelist": ({"SLURM_JOB_NODELIST": "n[0-99999999999]"}, "SLURM_JOB_NODELIST"),
    "ranks-in-all": ({"SLURM_JOB_NODELIST": "n[0-65535]", "SLURM_GPUS_PER_NODE": "1024"}, "SLURM_GPUS_PER_NODE"),
}


@pytest.mark.parametrize(("env", "variable"), list(HUGE_ROWS.values()), ids=list(HUGE_ROWS))
def test_counts_are_bounded_before_they_are_expanded(env, variable):
    with pytest.raises(SlurmAllocationError) as err:
        discover_allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", **env})
    assert err.value.variable == variable
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_step_task_count_in_other_digits_is_no_step():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "\u00b2"}
    assert discover_allocation(env).hosts == ("n1",)  # int('²') used to raise ValueError


COUNT = st.one_of(st.integers(min_value=0, max_value=10**20).map(str), st.sampled_from(["\u0663", "\u00b2", "", " "]))
TASKS = st.lists(st.tuples(COUNT, st.one_of(st.none(), COUNT)).map(
    lambda t: t[0] if t[1] is None else f"{t[0]}(x{t[1]})"), min_size=1, max_size=4).map(",".join)
SLURM_ENV = st.fixed_dictionaries({"SLURM_JOB_ID": st.just("7")}, optional={
    "SLURM_JOB_NODELIST": st.one_of(st.sampled_from(["n1", "n[1-4]", "n[0-99999999999]", "n[1-3],m"]),
                                    st.text(max_size=12)),
    "SLURM_TASKS_PER_NODE": st.one_of(TASKS, st.text(max_size=12)),
    "SLURM_GPUS_PER_NODE": st.one_of(COUNT, COUNT.map(lambda c: f"a100:{c}")),
    "SLURM_JOB_GPUS": st.one_of(st.tuples(COUNT, COUNT).map("-".join), COUNT),
    "SLURM_GPUS_ON_NODE": COUNT,
    "SLURM_STEP_ID": st.sampled_from(["", "0"]),
    "SLURM_STEP_NUM_TASKS": COUNT,
})


@settings(max_examples=300, deadline=1000)
@given(env=SLURM_ENV)
def test_any_slurm_environment_is_an_allocation_or_one_line(env):
    try:
        allocation = discover_allocation(env)
    except SlurmAllocationError as err:
        assert "\n" not in str(err) and len(str(err)) < 400
        return
    assert len(allocation.hosts) <= 65536 and sum(allocation.slots) <= MAX_RANKS
    assert len(allocation.pool()) == len(allocation.hosts)


def test_dry_run_inside_a_huge_allocation_is_one_line():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "99999999999(x99999999999)"}
    result = run_xrun("--dry-run", "t.py", env=env, timeout=20)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    assert result.stderr.startswith("xrun: SLURM_TASKS_PER_NODE='99999999999(x99999999999)': "), result.stderr
