import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.errors import SelectionError
from xrun.runner.hosts.selection import GRAMMAR, Selection, select
from xrun.runner.hosts.this_machine import local_pool

POOL = {"worker-0": (0, 1, 2, 3), "worker-1": (0, 1, 2, 3), "worker-2": (0, 1)}


@pytest.mark.parametrize(
    "selection, expected",
    [
        (Selection(), POOL),
        (Selection(include="worker-1"), {"worker-1": (0, 1, 2, 3)}),
        (Selection(include="worker-0:0,2@worker-1"), {"worker-0": (0, 2), "worker-1": (0, 1, 2, 3)}),
        (Selection(include="worker-1:2,0,2@worker-0:3"), {"worker-0": (3,), "worker-1": (0, 2)}),  # file order, merged
        (Selection(include="worker-0:1@worker-0:0"), {"worker-0": (0, 1)}),
        (Selection(include="worker-0@worker-0:1"), {"worker-0": (0, 1, 2, 3)}),
        (Selection(exclude="worker-1"), {"worker-0": (0, 1, 2, 3), "worker-2": (0, 1)}),
        (Selection(exclude="worker-0:0,1@worker-2:1"), {"worker-0": (2, 3), "worker-1": (0, 1, 2, 3), "worker-2": (0,)}),
        (Selection(exclude="worker-2:0,1"), {"worker-0": (0, 1, 2, 3), "worker-1": (0, 1, 2, 3)}),  # emptied -> dropped
        (Selection(num_nodes=2), {"worker-0": (0, 1, 2, 3), "worker-1": (0, 1, 2, 3)}),
        (Selection(num_gpus=2), {"worker-0": (0, 1), "worker-1": (0, 1), "worker-2": (0, 1)}),
        (Selection(num_nodes=1, num_gpus=1), {"worker-0": (0,)}),
    ],
)
def test_select(selection, expected):
    world = select(POOL, selection)
    assert world == expected
    assert list(world) == list(expected)


@pytest.mark.parametrize(
    "selection, message",
    [
        (Selection(include="a", exclude="b"), "--include 'a': cannot be combined with --exclude"),
        (Selection(include="worker-0", num_gpus=1), "--include 'worker-0': cannot be combined with --num_gpus"),
        (Selection(exclude="worker-0", num_nodes=1), "--exclude 'worker-0': cannot be combined with --num_nodes"),
        (Selection(include="nope"), "--include 'nope': unknown host 'nope'; known hosts: worker-0, worker-1, worker-2"),
        (Selection(exclude="nope:1"), "--exclude 'nope:1': unknown host 'nope'"),
        (Selection(include="worker-2:5"), "--include 'worker-2:5': host 'worker-2' has no slot 5; its slots are 0,1"),
        (Selection(include="w:"), f"--include 'w:': 'w:' has ':' but no slots; {GRAMMAR}"),
        (Selection(include="worker-0:a"), "slot 'a' in 'worker-0:a' is not a non-negative integer"),
        (Selection(include="worker-0:1:2"), "'worker-0:1:2' has more than one ':'"),
        (Selection(include="worker-0@"), "empty host between '@'"),
        (Selection(include="@worker-0"), "empty host between '@'"),
        (Selection(include="worker-0@@worker-1"), "empty host between '@'"),
        (Selection(include="worker-0:1,"), "slot '' in 'worker-0:1,' is not a non-negative integer"),
        (Selection(include="worker-0:,1"), "slot '' in 'worker-0:,1'"),
        (Selection(include=":1"), "':1' has no host name"),
        (Selection(include=""), f"--include '': empty; {GRAMMAR}"),
        (Selection(include="worker-0:-1"), "slot '-1'"),
        (Selection(exclude="worker-0@worker-1@worker-2"), "--exclude 'worker-0@worker-1@worker-2': leaves no devices"),
        (Selection(num_nodes=4), "--num_nodes '4': only 3 host(s) available: worker-0, worker-1, worker-2"),
        (Selection(num_nodes=0), "--num_nodes '0': must be a positive integer"),
        (Selection(num_gpus=3), "--num_gpus '3': host 'worker-2' has only 2 slot(s)"),
        (Selection(num_gpus=-1), "--num_gpus '-1': must be a positive integer"),
    ],
)
def test_select_errors(selection, message):
    with pytest.raises(SelectionError) as caught:
        select(POOL, selection)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    "env, selection, detected, expected, notice",
    [
        ({}, Selection(), 0, {"localhost": (0,)}, None),  # a laptop: one CPU rank
        ({}, Selection(num_gpus=3), 0, {"localhost": (0, 1, 2)}, None),  # CPU: N processes
        ({}, Selection(), 4, {"localhost": (0, 1, 2, 3)}, None),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, Selection(), 4, {"localhost": (2, 3)}, None),
        ({"CUDA_VISIBLE_DEVICES": ""}, Selection(), 0, {"localhost": (0,)}, None),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, Selection(num_gpus=1), 4, {"localhost": (0, 1, 2, 3)}, "ignoring"),
    ],
)
def test_local_pool(env, selection, detected, expected, notice):
    found = local_pool(env, selection, detect=lambda: detected)
    assert found.pool == expected
    assert (found.notice is not None and notice in found.notice) if notice else found.notice is None


@pytest.mark.parametrize("visible", ["GPU-1234-abcd", "0,0", "0,,1"])
def test_local_pool_bad_visible_devices(visible):
    with pytest.raises(SelectionError, match="CUDA_VISIBLE_DEVICES"):
        local_pool({"CUDA_VISIBLE_DEVICES": visible}, Selection(), detect=lambda: 2)


def test_local_gpu_count_is_strict():
    pool = local_pool({}, Selection(num_gpus=3), detect=lambda: 2).pool
    with pytest.raises(SelectionError, match="has only 2 slot"):
        select(pool, Selection(num_gpus=3))


SPEC = st.text(alphabet="worke-012:,@x", max_size=30)


@settings(max_examples=400)
@given(
    include=st.one_of(st.none(), SPEC),
    exclude=st.one_of(st.none(), SPEC),
    num_nodes=st.one_of(st.none(), st.integers(-2, 5)),
    num_gpus=st.one_of(st.none(), st.integers(-2, 5)),
)
def test_random_selections_never_traceback(include, exclude, num_nodes, num_gpus):
    try:
        world = select(POOL, Selection(include, exclude, num_nodes, num_gpus))
    except SelectionError as err:
        assert "\n" not in str(err)
        return
    assert world
    assert [h for h in POOL if h in world] == list(world)  # hostfile order
    for host, slots in world.items():
        assert slots and set(slots) <= set(POOL[host]) and list(slots) == sorted(set(slots))
