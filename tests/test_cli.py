"""The xrun command line as a user runs it: a real subprocess, exit codes, one-line errors."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, run_xrun
from xrun.joined.entry import main

HOSTFILE = os.path.join(ROOT, "hostfiles", "two-workers")


def dry_json(*args, env=None):
    result = run_xrun("--dry-run=json", *args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_local_dry_run_json():
    data = dry_json("--num_gpus", "2", "train.py", "--lr", "3e-4")
    assert data["backend"] == "local" and data["world_size"] == 2 and data["master_addr"] == "127.0.0.1"
    (node,) = data["nodes"]
    assert node["host"] == "localhost" and node["slots"] == [0, 1]
    assert [r["env"]["LOCAL_RANK"] for r in node["ranks"]] == ["0", "1"]
    assert node["ranks"][1]["argv"][1:] == ["-u", "train.py", "--local_rank=1", "--lr", "3e-4"]


def test_local_default_is_one_cpu_rank():
    assert dry_json("train.py")["world_size"] == 1


def test_cuda_visible_devices_become_local_slots():
    data = dry_json("train.py", env={"CUDA_VISIBLE_DEVICES": "1,3"})
    assert data["nodes"][0]["slots"] == [1, 3]
    assert data["nodes"][0]["ranks"][0]["env"]["CUDA_VISIBLE_DEVICES"] == "1,3"


def test_cuda_visible_devices_ignored_with_filter_flag():
    result = run_xrun("--dry-run=json", "--num_gpus", "1", "t.py", env={"CUDA_VISIBLE_DEVICES": "1,3"})
    assert result.returncode == 0
    assert "ignoring CUDA_VISIBLE_DEVICES=1,3" in result.stderr


def test_hostfile_with_only_localhost_runs_locally(tmp_path):
    hostfile = tmp_path / "hf"
    hostfile.write_text("localhost slots=2\nworker-9 slots=2\n")
    data = dry_json("-H", str(hostfile), "-i", "localhost:1", "t.py")
    assert data["backend"] == "local" and data["nodes"][0]["slots"] == [1]


def test_weird_args_round_trip_through_dry_run(weird_args):
    data = dry_json("--no_local_rank", "train.py", *weird_args)
    assert data["nodes"][0]["ranks"][0]["argv"][3:] == list(weird_args)


def test_double_dash_separates_script():
    data = dry_json("--no_local_rank", "--", "--weird-script-name", "x")
    # python's own "--" makes it run the dash-named file as a script (issue 13 item 9: it used to be an option).
    assert data["nodes"][0]["ranks"][0]["argv"][2:] == ["--", "--weird-script-name", "x"]


def test_a_script_named_like_an_option_runs(tmp_path):
    (tmp_path / "-weird.py").write_text("import sys; print('ran', sys.argv[1:])\n")
    result = subprocess.run([sys.executable, "-m", "xrun", "--no_local_rank", "--", "-weird.py", "--lr", "3"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr
    assert "ran ['--lr', '3']" in result.stdout


@pytest.mark.parametrize(
    "flag", [["--num-gpus", "2"], ["--num_accelerators", "2"], ["--nproc_per_node", "2"], ["--nproc-per-node", "2"]]
)
def test_flag_spellings(flag):
    assert dry_json(*flag, "t.py")["world_size"] == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["-H", "/nonexistent/hosts", "t.py"], "xrun: /nonexistent/hosts: no such file"),
        (["-H", HOSTFILE, "-i", "w:", "t.py"], "xrun: --include 'w:': 'w:' has ':' but no slots; expected HOST"),
        (["-H", HOSTFILE, "-i", "worker-0", "-e", "worker-1", "t.py"], "xrun: --include 'worker-0': cannot be combined with --exclude"),
        (["-H", HOSTFILE, "-i", "worker-0:9", "t.py"], "xrun: --include 'worker-0:9': host 'worker-0' has no slot 9; its slots are 0,1,2,3"),
        (["-H", HOSTFILE, "--num_nodes", "3", "t.py"], "xrun: --num_nodes '3': only 2 host(s) available"),
        (["--num_gpus", "x", "t.py"], "xrun: argument --num_gpus/--num-gpus"),
        (["--module", "--no_python", "t.py"], "xrun: --module: cannot be combined with --no_python"),
        (["--master_port", "70000", "t.py"], "xrun: --master_port: 70000 is not a TCP port"),
        (["--dry-run=yaml", "t.py"], "xrun: --dry-run: unknown format 'yaml'"),
        (["--launcher", "pdhs", "t.py"], "xrun: --launcher: unknown backend 'pdhs'; known: impi, local, mpich, mvapich, no_ssh, openmpi, pdsh, slurm, ssh"),
        (["--bogus-flag", "t.py"], "xrun: unknown flag --bogus-flag: not a flag of xrun; arguments for the script go after it (xrun t.py --bogus-flag)"),
        ([], "xrun: missing SCRIPT"),
        (["--bind_core_list", "0-1", "t.py"], "xrun: --bind_core_list: only applies with --bind_cores_to_rank"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message):
    result = run_xrun(*args)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(message), result.stderr


@pytest.mark.parametrize(
    "argv, flag, meant",
    [
        (["--num-gpu", "2", "hello.py"], "--num-gpu", "--num-gpus"),
        (["--nnode", "2", "hello.py"], "--nnode", "--nnodes"),
        (["--num_gpu=2", "hello.py"], "--num_gpu", "--num_gpus"),
        (["--master_ad", "1.2.3.4", "hello.py"], "--master_ad", "--master_addr"),  # an abbreviation argparse took
        (["--lr", "3", "hello.py"], "--lr", None),
        (["-x", "hello.py"], "-x", None),
    ],
)
def test_the_splitter_names_an_unknown_flag(argv, flag, meant):
    from xrun.argsplit import split_argv
    from xrun.errors import UnknownFlagError
    from xrun.runner.cli import build_parser

    with pytest.raises(UnknownFlagError) as caught:
        split_argv(build_parser(), argv)
    assert (caught.value.flag, caught.value.meant) == (flag, meant)


@pytest.mark.parametrize(
    "argv, example",
    [
        (["--lr", "3", "hello.py", "--epochs", "2"], "(xrun hello.py --lr 3)"),
        (["--lr=3", "hello.py"], "(xrun hello.py --lr=3)"),
        (["--verbose", "hello.py", "x"], "(xrun hello.py --verbose)"),
        (["--lr", "3", "train"], "(xrun train --lr 3)"),
        (["--lr"], "(xrun SCRIPT --lr)"),
        (["--lr", "--epochs"], "(xrun SCRIPT --lr)"),
    ],
)
def test_a_scripts_flag_before_the_script_says_where_it_goes(argv, example):
    from xrun.argsplit import split_argv
    from xrun.errors import UnknownFlagError
    from xrun.runner.cli import build_parser

    with pytest.raises(UnknownFlagError, match="arguments for the script go after it") as caught:
        split_argv(build_parser(), argv)
    assert str(caught.value).endswith(example), str(caught.value)


@pytest.mark.parametrize("argv", [["-Hhf", "t.py"], ["--num-gpus=2", "t.py"], ["--dry-run=json", "t.py"]])
def test_known_flags_in_every_form_still_split(argv):
    from xrun.argsplit import split_argv
    from xrun.runner.cli import build_parser

    split = split_argv(build_parser(), argv)
    assert (split.options, split.program) == (tuple(argv[:-1]), "t.py")


def test_no_parser_takes_an_abbreviation():
    from xrun.common.agent_cli import build_parser as agent_parser
    from xrun.errors import XrunError
    from xrun.launch.session.main import build_parser as connect_parser
    from xrun.runner.check import build_parser as check_parser
    from xrun.runner.cli import build_parser

    cases = [(build_parser(), ["--num_gp", "2"]), (agent_parser(), ["--world_inf", "x", "--node_rank", "0"]),
             (check_parser(), ["--num_gp", "2"]), (connect_parser(), ["--connect", "h:1", "--node_ran", "0"])]
    for parser, argv in cases:
        assert parser.allow_abbrev is False, parser.prog
        with pytest.raises(XrunError):
            parser.parse_args(argv)


def test_bad_hostfile_line_named(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb slots=four\n")
    result = run_xrun("-H", str(hostfile), "t.py")
    assert result.returncode == 2
    assert result.stderr == f"xrun: {hostfile}:2: 'b slots=four': slots must be a positive integer, not 'four'\n"


def test_help_and_version():
    assert "--include" in run_xrun("--help").stdout
    assert run_xrun("--version").stdout.startswith("xrun ")


def test_user_help_goes_to_the_script():
    data = dry_json("--no_local_rank", "t.py", "--help")
    assert data["nodes"][0]["ranks"][0]["argv"][-1] == "--help"


@pytest.mark.parametrize("args", [["--help"], ["--dry-run", "t.py"], ["--dry-run=json", "--num_gpus", "2", "t.py"]])
def test_no_torch_on_the_launch_path(args):
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "xrun", *args], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines() if "|" in line}
    heavy = {"torch", "numpy", "paramiko", "rich", "deepspeed", "mpi4py"} & imported
    assert not heavy, heavy


# Ctrl-C while xrun's modules load, made deterministic: the import of the CLI is what gets interrupted.
INTERRUPTED_LOAD = """
import builtins, runpy, sys
real_import = builtins.__import__
def interrupted(name, *args, **kwargs):
    if name == "xrun.joined.entry":
        raise KeyboardInterrupt
    return real_import(name, *args, **kwargs)
builtins.__import__ = interrupted
sys.argv = ["xrun", "t.py"]
runpy.run_module("xrun", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_while_xrun_loads_is_130_without_a_traceback():
    result = subprocess.run([sys.executable, "-c", INTERRUPTED_LOAD], capture_output=True, text=True, cwd=ROOT,
                            timeout=20)
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr


def test_console_script_installed():
    result = subprocess.run(["xrun", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("xrun ")


ARG = st.text(alphabet="-=:@,Hie0123abx./ ", max_size=12)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ARG, max_size=6))
def test_random_command_lines_never_traceback(capsys, argv):
    """In-process fuzz of everything a user can type before the script (dry-run, so nothing starts)."""
    try:
        code = main(["--dry-run=json", "-H", HOSTFILE, *argv, "t.py"])
    except SystemExit as exit_:  # argparse's --help/--version
        code = exit_.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert code in (0, 2), (argv, err)
    if code == 2:
        assert err.count("\n") == 1


RANGES = os.path.join(ROOT, "hostfiles", "ranges")


@pytest.mark.parametrize(
    "hostfile, flags, world",
    [
        (HOSTFILE, [], {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}),
        (HOSTFILE, ["-i", "worker-1"], {"worker-1": [0, 1, 2, 3]}),
        (HOSTFILE, ["-i", "worker-0:0,2@worker-1"], {"worker-0": [0, 2], "worker-1": [0, 1, 2, 3]}),
        (HOSTFILE, ["--include", "worker-1:3,1,1@worker-0:2"], {"worker-0": [2], "worker-1": [1, 3]}),
        (HOSTFILE, ["-e", "worker-0"], {"worker-1": [0, 1, 2, 3]}),
        (HOSTFILE, ["--exclude", "worker-0:0@worker-1:1,3"], {"worker-0": [1, 2, 3], "worker-1": [0, 2]}),
        (HOSTFILE, ["--num_nodes", "1"], {"worker-0": [0, 1, 2, 3]}),
        (HOSTFILE, ["--num_gpus", "2"], {"worker-0": [0, 1], "worker-1": [0, 1]}),
        (HOSTFILE, ["--num-nodes", "1", "--num-gpus", "3"], {"worker-0": [0, 1, 2]}),
        (RANGES, ["-i", "node07:7@gpu-a2"], {"node07": [7], "gpu-a2": [0, 1]}),
        (RANGES, ["-e", "node01@node02@node03@node07"], {"gpu-a1": [0, 1], "gpu-a2": [0, 1]}),
    ],
)
def test_multi_host_dry_run_world(hostfile, flags, world):
    data = dry_json("-H", hostfile, *flags, "train.py", "--lr", "3e-4")
    assert {n["host"]: n["slots"] for n in data["nodes"]} == world
    assert [n["host"] for n in data["nodes"]] == list(world)  # hostfile order
    assert data["world_size"] == sum(len(s) for s in world.values())
    ranks = [r for n in data["nodes"] for r in n["ranks"]]
    assert [r["rank"] for r in ranks] == list(range(data["world_size"]))
    for node in data["nodes"]:
        assert [r["local_rank"] for r in node["ranks"]] == list(range(len(node["slots"])))
        assert all(r["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, node["slots"])) for r in node["ranks"])
        assert all(r["env"]["GROUP_RANK"] == str(node["node_rank"]) for r in node["ranks"])
        assert node["command"] and "xrun.launch" in node["command"]
    assert ranks[-1]["argv"][-2:] == ["--lr", "3e-4"]
    if len(world) > 1:
        assert data["backend"] in ("pdsh", "ssh")


def test_dry_run_lists_exported_names_never_values():
    secret = "hf_s3cr3t value"
    result = run_xrun("--dry-run=json", "-H", HOSTFILE, "--export", "MY_FLAG=1", "t.py", env={"HF_TOKEN": secret})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {"HF_TOKEN", "MY_FLAG"} <= set(data["nodes"][0]["exports"])
    assert secret not in result.stdout
    text = run_xrun("--dry-run", "-H", HOSTFILE, "t.py", env={"HF_TOKEN": secret}).stdout
    assert "exports:" in text and "HF_TOKEN" in text and secret not in text
