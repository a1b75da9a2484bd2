"""The plan digest: canonical, order-stable, free of host-specific values; differences named in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.common.rankplan import LaunchOptions
from xrun.common.spec import AgentOptions, ElasticOptions, PythonMode
from xrun.runner.plan import JobRequest, make_plan
from xrun.runner.pod.digest import PlanDigest, PlanDigestError, first_difference, make_digest, plan_digest
from xrun.runner.remote_options import RemoteOptions

WORLD = {"node0": (0, 1), "node1": (0, 1)}


def digest(world=WORLD, **request):
    base = {"script": "train.py", "args": ("--lr", "3e-4"), "master_addr": "m0", "master_port": 23456,
            "env": {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/w"}}
    return plan_digest(make_plan(JobRequest(**{**base, **request}), world, "no_ssh"))


def test_same_job_same_digest_whatever_the_node():
    mine = digest(run_id="a", cwd="/home/me", remote=RemoteOptions(no_ssh=True, node_rank=0),
                  launch=LaunchOptions(python="/venv/a/bin/python"), options=AgentOptions(log_dir="/logs", quiet=True))
    theirs = digest(run_id="b", cwd="/work", remote=RemoteOptions(no_ssh=True, node_rank=1),
                    launch=LaunchOptions(python="/usr/bin/python3"), env={"PYTHONPATH": "/x", "NCCL_DEBUG": "WARN"})
    assert mine == theirs and len(mine.sha256) == 64
    assert first_difference(mine, theirs, node_name="node1") is None


def test_fields_and_canonical_form():
    fields = digest().fields
    assert list(fields) == sorted(["xrun", "script", "args", "launch", "world", "master", "exports", "elastic"])
    assert fields["world"] == [["node0", [0, 1]], ["node1", [0, 1]]]
    assert fields["exports"] == ["NCCL_DEBUG", "PYTHONPATH"]
    assert make_digest(dict(reversed(list(fields.items())))).sha256 == digest().sha256  # key order is not content
    assert digest(world={"node1": (0, 1), "node0": (0, 1)}) != digest()  # node order is


def test_round_trip_through_the_wire():
    mine = digest(args=("caf\u00e9", "\udcff", "a\nb"))  # an undecodable argv byte arrives as a lone surrogate
    wire = json.loads(json.dumps(mine.to_json()))
    assert PlanDigest.from_json(wire) == mine


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected"),
        ({"fields": {}}, "field 'xrun' is missing"),
        ({"fields": dict(digest().fields, args="--lr 1"), "sha256": "x"}, "field 'args' has the wrong type"),
        ({"fields": dict(digest().fields, world=[["a", [True]]]), "sha256": "x"}, "field 'world' has the wrong type"),
        ({"fields": dict(digest().fields), "sha256": "0" * 64}, "the sha256 does not match"),
    ],
)
def test_bad_digest_from_a_peer(data, message):
    with pytest.raises(PlanDigestError, match=message):
        PlanDigest.from_json(data)


MODULE = LaunchOptions(mode=PythonMode.MODULE)


@pytest.mark.parametrize(
    ("theirs", "line"),
    [
        (dict(script="train2.py"), "node3 runs train2.py; node 0 runs train.py"),
        (dict(args=("--lr", "0.1")), "node3 passes --lr 0.1; node 0 passes --lr 3e-4"),
        (dict(args=("--lr", "3e-4", "--debug")), "node3 passes --debug; node 0 passes no more arguments after 3e-4"),
        (dict(args=()), "node3 passes no more arguments; node 0 passes --lr"),
        (dict(args=("--lr", "it's")), "node3 passes --lr 'it'\"'\"'s'; node 0 passes --lr 3e-4"),
        (dict(launch=MODULE), "node3 runs the script as a module (--module); node 0 as a script"),
        (dict(launch=LaunchOptions(local_rank_arg=False)),
         "node3 passes --no_local_rank; node 0 appends --local_rank=N"),
        (dict(world={"node0": (0, 1)}), "node3 plans 1 nodes; node 0 plans 2"),
        (dict(world={"node0": (0, 1), "node1": (0,)}), "node3 has node1 with slots 0 as node 1; node 0 has node1 with "
                                                       "slots 0,1"),
        (dict(master_addr="other"), "node3 uses master other:23456; node 0 uses m0:23456"),
        (dict(master_port=29500), "node3 uses master m0:29500; node 0 uses m0:23456"),
        (dict(env={"NCCL_DEBUG": "INFO", "PYTHONPATH": "/w", "HF_TOKEN": "s3cr3t"}),
         "node3 exports HF_TOKEN; node 0 does not"),
        (dict(env={"PYTHONPATH": "/w"}), "node 0 exports NCCL_DEBUG; node3 does not"),
        (dict(elastic=ElasticOptions()), "node3 runs --elastic; node 0 does not"),
    ],
)
def test_first_difference_in_one_line(theirs, line):
    world = theirs.pop("world", WORLD)
    assert first_difference(digest(), digest(world=world, **theirs), node_name="node3") == line


def test_version_is_named_first():
    mine = digest()
    theirs = make_digest(dict(mine.fields, xrun="0.1.1", script="other.py"))
    expected = f"node3 has xrun 0.1.1; node 0 has {mine.fields['xrun']}"
    assert first_difference(mine, theirs, node_name="node3") == expected


def test_elastic_settings_and_unknown_fields():
    mine = digest(elastic=ElasticOptions(max_restarts=0))
    theirs = digest(elastic=ElasticOptions(max_restarts=3))
    assert first_difference(mine, theirs, node_name="n2") == "n2 has elastic max_restarts=3; node 0 has max_restarts=0"
    newer = make_digest(dict(mine.fields, zeta={"a": 1}))  # a field a later version adds
    assert first_difference(mine, newer, node_name="n2", my_name="me") == 'n2 has zeta {"a": 1}; me has null'


def test_long_values_are_cut():
    line = first_difference(digest(), digest(script="x" * 500), node_name="n1")
    assert len(line) < 200 and "\n" not in line


ARGS = st.lists(st.sampled_from(["--lr", "0.1", "3e-4", "-x", "", "a b", "\n", "--", "é"]), max_size=6)


@settings(max_examples=200, deadline=None)
@given(ARGS, ARGS, st.sampled_from(["a.py", "b.py"]), st.booleans())
def test_difference_is_none_exactly_when_the_digests_match(mine_args, their_args, script, local_rank):
    mine = digest(args=tuple(mine_args))
    theirs = digest(args=tuple(their_args), script=script, launch=LaunchOptions(local_rank_arg=local_rank))
    line = first_difference(mine, theirs, node_name="node3")
    assert (line is None) == (mine.sha256 == theirs.sha256)
    if line is not None:
        assert "\n" not in line and line.startswith(("node3 ", "node 0 "))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["xrun", "script", "args", "launch", "world", "master", "exports", "elastic",
                                        "other"]), JSON), st.text(max_size=3))
def test_any_message_from_a_peer_is_a_digest_or_a_digest_error(fields, sha):
    base = digest()
    for data in ({"fields": fields, "sha256": sha}, {"fields": {**base.fields, **fields}, "sha256": sha}):
        try:
            theirs = PlanDigest.from_json(data)
        except PlanDigestError as err:
            assert err.exit_code == 2 and "\n" not in str(err)
            continue
        line = first_difference(base, theirs, node_name="n1")
        assert line is None or "\n" not in line


def test_digest_of_a_replaced_request_changes():
    request = JobRequest(script="t.py", master_addr="m", master_port=1)
    a = plan_digest(make_plan(request, WORLD, "no_ssh"))
    b = plan_digest(make_plan(replace(request, args=("x",)), WORLD, "no_ssh"))
    assert a != b
