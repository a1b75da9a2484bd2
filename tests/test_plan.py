import shlex

import pytest

from xrun.common.agent_cli import parse_agent_argv
from xrun.common.command import AgentCommand, agent_argv
from xrun.common.rankplan import LaunchOptions, Rendezvous
from xrun.common.spec import AgentOptions, PythonMode
from xrun.errors import UsageError
from xrun.runner.backends import Invocation, NodeCommand
from xrun.runner.dryrun import plan_json, plan_text
from xrun.runner.hosts.selection import Selection
from xrun.runner.job.config import JobConfig
from xrun.runner.plan import JobRequest, make_plan, standalone_plan
from xrun.runner.planner import is_local_world
from xrun.shell import render

WORLD = {"worker-0": (1, 3), "worker-1": (0,)}


def test_plan_ranks_are_consecutive_in_node_then_slot_order():
    plan = make_plan(JobRequest(script="t.py", run_id="r"), WORLD, "ssh")
    assert [(n.host, [r.rank for r in n.ranks]) for n in plan.nodes] == [("worker-0", [0, 1]), ("worker-1", [2])]
    assert plan.world_size == 3
    assert plan.rendezvous == Rendezvous(None, 29500, "r")  # node 0's address: the start barrier decides it
    assert plan.shown_master_addr == "<worker-0 address>"  # as --dry-run shows it
    assert "MASTER_ADDR" not in plan.nodes[0].ranks[0].env  # the agent sets it at the start (with_rendezvous)
    assert plan.nodes[0].ranks[1].env["CUDA_VISIBLE_DEVICES"] == "1,3"


def test_a_large_plan_shares_what_its_ranks_have_alike():
    """A head plans 10,000 nodes at once (issue 22 §7): equal argvs, the exports and equal strings are one object
    each, not one per rank; the values stay each rank's own."""
    world = {f"h{i}": (0,) for i in range(12)}
    plan = make_plan(JobRequest(script="t.py", args=("--lr", "1"), env={"HF_HOME": "/x"}), world, "pdsh")
    first, last = plan.nodes[0], plan.nodes[11]
    assert first.ranks[0].argv is last.ranks[0].argv and first.env is last.env and first.env == {"HF_HOME": "/x"}
    env = last.ranks[0].env
    assert env["RANK"] == env["NODE_RANK"] == "11" and env["RANK"] is env["NODE_RANK"]
    assert env["CUDA_VISIBLE_DEVICES"] is first.ranks[0].env["CUDA_VISIBLE_DEVICES"]
    two = make_plan(JobRequest(script="t.py"), {"a": (0, 1), "b": (0, 1)}, "pdsh")
    assert [r.env["RANK"] for r in two.nodes[1].ranks] == ["2", "3"] and two.nodes[1].ranks[1].env["NODE_RANK"] == "1"
    assert two.nodes[0].ranks[1].argv is two.nodes[1].ranks[1].argv != two.nodes[1].ranks[0].argv


def test_local_plan_uses_loopback_master():
    plan = make_plan(JobRequest(script="t.py"), {"localhost": (0,)}, "local")
    assert plan.rendezvous.master_addr == "127.0.0.1"


def test_explicit_master_addr_wins():
    plan = make_plan(JobRequest(script="t.py", master_addr="10.1.1.1", master_port=1234), WORLD, "ssh")
    assert plan.nodes[1].ranks[0].env["MASTER_ADDR"] == "10.1.1.1"
    assert plan.nodes[1].ranks[0].env["MASTER_PORT"] == "1234"


@pytest.mark.parametrize(
    "world, hostfile, expected",
    [({"localhost": (0,)}, None, True), ({"localhost": (0,)}, "hf", True), ({"worker-0": (0,)}, "hf", False),
     ({"localhost": (0,), "b": (0,)}, "hf", False)],
)
def test_is_local_world(world, hostfile, expected):
    assert is_local_world(world, hostfile) is expected


def test_plan_json_schema():
    plan = make_plan(JobRequest(script="t.py", args=("--lr", "1"), run_id="r"), WORLD, "ssh")
    invocation = Invocation("ssh", (NodeCommand("worker-0", ("a", "b c")),))
    data = plan_json(plan, invocation)
    assert data["world_size"] == 3 and data["backend"] == "ssh" and data["master_port"] == 29500
    assert data["world_info"] == plan.world_info
    assert data["nodes"][0]["slots"] == [1, 3] and data["nodes"][0]["command"] == ["a", "b c"]
    rank = data["nodes"][1]["ranks"][0]
    assert set(rank) == {"rank", "local_rank", "env", "argv"}
    assert rank["rank"] == 2 and rank["argv"][-3:] == ["--local_rank=0", "--lr", "1"]
    assert "rank 2 (local 0)" in plan_text(plan, invocation)


def test_render_round_trips(weird_args):
    assert shlex.split(render(weird_args)) == list(weird_args)


def test_agent_argv_round_trip(weird_args):
    command = AgentCommand(
        world=WORLD,
        node_rank=1,
        rendezvous=Rendezvous("10.0.0.1", 1234, "job"),
        launch=LaunchOptions(python="/usr/bin/python3", mode=PythonMode.MODULE, local_rank_arg=False),
        options=AgentOptions(log_dir="/tmp/l d", prefix=False, quiet=True, shutdown_timeout=2.5, bind_cores=True,
                             bind_core_list="0-3"),
        script="pkg.train",
        args=weird_args,
    )
    argv = agent_argv(command)
    assert argv[:4] == ("/usr/bin/python3", "-u", "-m", "xrun.launch")
    parsed = parse_agent_argv(argv[4:])
    assert parsed == AgentCommand(**{**command.__dict__, "launch": LaunchOptions(
        python=parsed.launch.python, mode=PythonMode.MODULE, local_rank_arg=False)})
    assert parsed.args == weird_args


def test_agent_accepts_deepspeed_style_argv():
    parsed = parse_agent_argv(
        ["--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19", "--node_rank=0", "--master_addr=127.0.0.1",
         "--master_port=29500", "train.py", "--deepspeed", "--lr", "1"]
    )
    spec = parsed.node_spec()
    assert [r.env["RANK"] for r in spec.ranks] == ["0", "1"]
    assert spec.ranks[0].argv[-4:] == ("--local_rank=0", "--deepspeed", "--lr", "1")


def test_a_stand_alone_agents_plan_is_its_node_alone_numbered_in_the_whole_world():
    # issue 38 §1: node 1 of {"a": [0, 1], "b": [0, 1]}, as DeepSpeed's per-node launcher starts it
    command = parse_agent_argv(["--world_info=eyJhIjogWzAsIDFdLCAiYiI6IFswLCAxXX0=", "--node_rank=1",
                                "--master_addr=10.0.0.1", "--master_port=29600", "--max_restarts=2", "train.py"])
    plan = standalone_plan(command)
    [node] = plan.nodes
    assert (node.host, node.node_rank, plan.world, plan.backend) == ("b", 1, {"a": (0, 1), "b": (0, 1)}, "local")
    assert [(r.rank, r.env["WORLD_SIZE"], r.env["MASTER_ADDR"], r.env["MASTER_PORT"]) for r in node.ranks] == [
        (2, "4", "10.0.0.1", "29600"), (3, "4", "10.0.0.1", "29600")]
    assert node.ranks[0].env["TORCHELASTIC_MAX_RESTARTS"] == "2"
    # its head runs and hears this node's ranks only: the views do not count ranks 0..3 as the default group
    assert (plan.world_size, plan.ranks_run, plan.heard_world_size) == (4, 2, None)
    config = JobConfig.from_plan(plan, join_timeout=60.0)
    assert (config.world_size, config.master_port, config.pick_master_port, config.restart.max_restarts) == (
        2, 29600, False, 2)
    # the plan's own stand-alone command line is the one it came from
    assert plan.agent_command(node) == command


def test_module_with_no_python_is_an_error():
    with pytest.raises(UsageError, match="--module: cannot be combined with --no_python"):
        parse_agent_argv(["--world_info=eyJhIjogWzBdfQ==", "--node_rank=0", "--module", "--no_python", "t"])


def test_selection_is_part_of_the_request():
    request = JobRequest(script="t", selection=Selection(include="a"))
    assert request.selection.filters
