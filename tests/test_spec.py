import base64
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xrun.common.rankplan import LaunchOptions, Rendezvous, decode_world_info, encode_world_info, node_ranks
from xrun.common.spec import AgentOptions, NodeSpec, PythonMode
from xrun.errors import UsageError, WorldInfoError

RDZV = Rendezvous("10.0.0.1", 29500, "job-1")
WORLD = {"worker-0": (0, 2), "worker-1": (0, 1, 2)}


def deepspeed_encode(world):
    """DeepSpeed's own encoder (runner.py), reproduced to prove byte compatibility."""
    return base64.urlsafe_b64encode(json.dumps(world).encode("utf-8")).decode("utf-8")


def test_world_info_matches_deepspeed():
    assert encode_world_info({"localhost": (0, 1)}) == "eyJsb2NhbGhvc3QiOiBbMCwgMV19"
    assert encode_world_info(WORLD) == deepspeed_encode({"worker-0": [0, 2], "worker-1": [0, 1, 2]})


def test_decode_deepspeed_string_keeps_order():
    text = deepspeed_encode({"b": [1], "a": [0, 3]})
    assert list(decode_world_info(text).items()) == [("b", (1,)), ("a", (0, 3))]


def test_decode_unpadded():
    assert decode_world_info("eyJhIjogWzBdfQ") == {"a": (0,)}


@pytest.mark.parametrize(
    "text",
    ["!!!", "bm90IGpzb24=", deepspeed_encode([1, 2]), deepspeed_encode({}), deepspeed_encode({"a": []}),
     deepspeed_encode({"a": [-1]}), deepspeed_encode({"a": ["0"]}), deepspeed_encode({"a": [True]})],
)
def test_decode_errors(text):
    with pytest.raises(WorldInfoError):
        decode_world_info(text)


@pytest.mark.parametrize("world, words", [
    ({"localhost": [0, 0]}, "a device is listed twice"),  # two ranks on one device
    ({"a": [99999999999]}, "device ids (0-1023)"),
    ({"a b": [0]}, "is not a host name"),
    ({"a": list(range(1025))}, "device ids (0-1023)"),
    ({"a": [*range(1024), 1023]}, "1025 slots; 1024 is the most"),
])
def test_a_world_info_string_is_held_to_what_a_hostfile_may_say(world, words):
    with pytest.raises(WorldInfoError, match=re.escape(words)):
        decode_world_info(deepspeed_encode(world))


HOST = st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,6}[a-z0-9])?(?:\.[a-z0-9]{1,4})?", fullmatch=True)


@given(st.dictionaries(HOST, st.lists(st.integers(0, 64), min_size=1, max_size=4, unique=True), min_size=1))
def test_world_info_round_trip(world):
    world = {host: tuple(slots) for host, slots in world.items()}
    assert decode_world_info(encode_world_info(world)) == world


def test_env_contract_node_1():
    ranks = node_ranks(WORLD, 1, RDZV, LaunchOptions(python="py"), "train.py", ("--lr", "3e-4"))
    assert [r.rank for r in ranks] == [2, 3, 4]
    assert ranks[2].env == {
        "RANK": "4",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "5",
        "LOCAL_WORLD_SIZE": "3",
        "LOCAL_SIZE": "3",
        "GROUP_RANK": "1",
        "NODE_RANK": "1",
        "CROSS_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "CROSS_SIZE": "2",
        "ROLE_NAME": "default",
        "ROLE_RANK": "4",
        "ROLE_WORLD_SIZE": "5",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "CUDA_VISIBLE_DEVICES": "0,1,2",
        "TORCHELASTIC_RUN_ID": "job-1",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    assert ranks[2].argv == ("py", "-u", "train.py", "--local_rank=2", "--lr", "3e-4")


@pytest.mark.parametrize(
    "launch, expected",
    [
        (LaunchOptions(python="py"), ("py", "-u", "t.py", "--local_rank=0", "x")),
        (LaunchOptions(python="py", local_rank_arg=False), ("py", "-u", "t.py", "x")),
        (LaunchOptions(python="py", mode=PythonMode.MODULE), ("py", "-u", "-m", "t.py", "--local_rank=0", "x")),
        (LaunchOptions(python="py", mode=PythonMode.NONE), ("t.py", "--local_rank=0", "x")),
        (LaunchOptions(python="py", mode=PythonMode.NONE, local_rank_arg=False), ("t.py", "x")),
    ],
)
def test_rank_argv_modes(launch, expected):
    assert node_ranks({"h": (0,)}, 0, RDZV, launch, "t.py", ("x",))[0].argv == expected


def test_weird_args_pass_through_untouched(weird_args):
    ranks = node_ranks(WORLD, 0, RDZV, LaunchOptions(python="py", local_rank_arg=False), "t.py", weird_args)
    assert all(rank.argv[3:] == weird_args for rank in ranks)


def test_bad_node_rank():
    with pytest.raises(UsageError, match="--node_rank: 2 is outside 0..1"):
        node_ranks(WORLD, 2, RDZV, LaunchOptions(), "t.py", ())


def test_node_spec_json_round_trip(weird_args):
    ranks = node_ranks(WORLD, 1, RDZV, LaunchOptions(python="py"), "t.py", weird_args)
    spec = NodeSpec(host="worker-1", node_rank=1, ranks=ranks, options=AgentOptions(log_dir="/l", quiet=True),
                    env={"HF_TOKEN": "a b\n'$x'"}, cwd="/w", run_id="job-1")
    assert NodeSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_node_spec_version_mismatch():
    data = NodeSpec(host="h", node_rank=0, ranks=()).to_json()
    data["version"] = 99
    with pytest.raises(UsageError, match="install the same xrun on every node"):
        NodeSpec.from_json(data)
