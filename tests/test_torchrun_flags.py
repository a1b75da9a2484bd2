"""Issue 41, pure: torchrun's flags translated into xrun's request (xrun.runner.torchrun), the plan's view of them
(``--nnodes N`` against the world, the console's local ranks as global ones) and ``--role`` in the env contract."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from xrun.common.agent_cli import parse_agent_argv
from xrun.common.command import AgentCommand, agent_argv
from xrun.common.output.streams import LineCopy
from xrun.common.rankplan import LaunchOptions, Rendezvous, node_ranks
from xrun.common.ranks.binding import Cpu, Topology, format_cpus, plan_numa_binding, read_cache_groups
from xrun.common.spec import AgentOptions, LocalEcho, NodeSpec, filter_list, local_echo, parse_filter_list, parse_std
from xrun.errors import BindingError, UsageError
from xrun.runner.cli import parse_request
from xrun.runner.plan import with_torchrun_world
from xrun.runner.torchrun import PET_FLAGS, resolve_nproc, torchrun_form


def request(*flags: str):  # type: ignore[no-untyped-def]
    return parse_request([*flags, "train.py", "--lr", "1"])[0]


@pytest.mark.parametrize("flags, form", [
    (["--nproc_per_node", "2"], True),
    (["--nproc-per-node=2"], True),
    (["--standalone"], True),
    (["-m"], True),
    (["--num_gpus", "2"], False),
    (["--master_port", "29501"], False),
    ([], False),
])
def test_a_line_that_spells_a_torchrun_flag_runs_in_torchruns_form(flags: list[str], form: bool) -> None:
    assert torchrun_form(flags) is form
    if "-m" not in flags:
        assert request(*flags).launch.local_rank_arg is not form  # torchrun never appends --local_rank=N


def test_elastic_typed_by_hand_keeps_xruns_form() -> None:
    pytest.importorskip("torch")
    assert request("--elastic", "--nnodes", "1:2").launch.local_rank_arg


def test_nnodes_equal_bounds_is_a_static_job_and_a_range_is_elastic() -> None:
    static = request("--nnodes", "1:1")
    assert static.elastic is None and static.torchrun.nnodes == 1
    pytest.importorskip("torch")
    elastic = request("--nnodes", "1:2")
    assert elastic.elastic is not None and (elastic.elastic.min_nodes, elastic.elastic.max_nodes) == (1, 2)


def test_torchruns_multinode_forms() -> None:
    # --node_rank given (or static rendezvous), no host list: pod mode with N numbered nodes
    by_rank = request("--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1")
    assert by_rank.pod.pod and by_rank.remote.node_rank == 1 and by_rank.selection.num_nodes == 2
    assert by_rank.elastic is None
    # c10d without --node_rank: torch numbers the nodes as they join, under its elastic agent
    pytest.importorskip("torch")
    joined = request("--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "10.0.0.1:29400")
    assert joined.elastic is not None and (joined.elastic.min_nodes, joined.elastic.max_nodes) == (2, 2)
    assert joined.elastic.rdzv_endpoint == "10.0.0.1:29400" and not joined.launch.local_rank_arg


def test_static_rendezvous_endpoint_and_id_are_rank_0s_address_port_and_the_run_id() -> None:
    local = request("--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--rdzv_id", "job42")
    assert local.elastic is None and local.master_addr is None and local.run_id == "job42"
    given = request("--rdzv_endpoint", "10.0.0.1:29411")
    assert (given.master_addr, given.master_port) == ("10.0.0.1", 29411)
    assert request("--rdzv_conf", "join_timeout=60").remote.join_timeout == 60


def test_standalone_ignores_rendezvous_flags_as_torchrun_does() -> None:
    assert request("--standalone", "--rdzv_id", "x", "--rdzv_endpoint", "h:1").run_id != "x"


def test_signals_to_handle_forwards_what_xrun_does_not_handle_itself() -> None:
    signals = request("--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1,HUP").options.forward_signals
    assert set(signals) == {signal.SIGUSR1, signal.SIGUSR2}
    assert set(request("--signals-to-handle", "SIGUSR2", "--forward_signals", "").options.forward_signals) == {
        signal.SIGUSR2}


def test_run_path_goes_ahead_of_no_python() -> None:
    assert request("--run-path", "--no-python").launch.mode.value == "script"


def test_local_addr_is_rank_0s_address_on_one_machine() -> None:
    assert request("--local-addr", "127.0.0.2").master_addr == "127.0.0.2"


@pytest.mark.parametrize("text, parsed", [("0", 0), ("3", 3), ("0:3,1:1", {0: 3, 1: 1}), (" 2 ", 2)])
def test_std_spec_as_torchrun_reads_it(text: str, parsed: object) -> None:
    assert parse_std("--tee", text) == parsed


@pytest.mark.parametrize("text", ["9", "x", "0:4", "-1", "", "0:3,"])
def test_bad_std_spec_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="--tee"):
        parse_std("--tee", text)


def test_nproc_words() -> None:
    assert resolve_nproc("cpu", accelerators=8, cpus=16) == 16
    assert resolve_nproc("auto", accelerators=0, cpus=4) == 4
    assert resolve_nproc("auto", accelerators=8, cpus=4) is None  # every accelerator: xrun's default
    assert resolve_nproc("gpu", accelerators=8, cpus=4) is None
    assert resolve_nproc(3, accelerators=8, cpus=4) == 3
    with pytest.raises(UsageError, match="no accelerator"):
        resolve_nproc("gpu", accelerators=0, cpus=4)


TWO_NODES = {"a": (0, 1, 2), "b": (0, 1, 2)}


@pytest.mark.parametrize("flags, console", [
    (["--local-ranks-filter", "0"], (0, 3)),
    (["--local-ranks-filter", "0,2"], (0, 2, 3, 5)),
    (["--redirects", "3"], ()),
    (["--redirects", "1:3", "--local-ranks-filter", "0,1"], (0, 3)),
    (["--redirects", "1"], (0, 1, 2, 3, 4, 5)),  # stdout only: every rank's stderr still shows
    (["--redirects", "0:2,1:3"], (0, 2, 3, 5)),
    (["--local-ranks-filter", "1", "--console_ranks", "0-3"], (1,)),
    (["--tee", "3"], None),
])
def test_the_consoles_local_ranks_are_every_nodes(flags: list[str], console: tuple[int, ...] | None) -> None:
    planned = with_torchrun_world(request(*flags, "--log_dir", "/tmp/x"), TWO_NODES)
    assert planned.options.console_ranks == console


def test_nnodes_is_checked_against_the_world() -> None:
    assert with_torchrun_world(request("--nnodes", "2"), TWO_NODES).torchrun.nnodes == 2
    with pytest.raises(UsageError, match="--nnodes: 3, but this job has 2 node"):
        with_torchrun_world(request("--nnodes", "3"), TWO_NODES)


def test_local_echo_is_torchruns_filter_and_redirects_per_stream() -> None:
    echo = local_echo("0,1", "0:1,1:2")
    assert [(echo.echoes(r, 1), echo.echoes(r, 2)) for r in range(3)] == [(False, True), (True, False), (False, False)]
    assert [(local_echo(None, "3").echoes(r, 1), local_echo(None, "3").shows(r)) for r in range(2)] == [(False,) * 2] * 2
    assert local_echo("", "0").echoes(5, 1)  # torchrun: an empty filter is no filter
    assert local_echo(None, "0:1,1:2").redirects_text() == "0:1,1:2" and local_echo(None, "0").redirects_text() is None


@pytest.mark.parametrize("flags", [["--redirects", "1"], ["--redirects", "0:1,1:2", "--local-ranks-filter", "1"]])
def test_local_echo_reaches_the_agent_by_spec_and_by_its_command_line(flags: list[str]) -> None:
    options = request(*flags, "--log_dir", "/tmp/x").options
    assert options.local_echo != LocalEcho()
    spec = NodeSpec(host="h", node_rank=0, ranks=(), options=options)
    assert NodeSpec.from_json(json.loads(json.dumps(spec.to_json()))).options == options
    command = AgentCommand(world=TWO_NODES, node_rank=0, rendezvous=Rendezvous("h", 1, "r"), launch=LaunchOptions(),
                           options=options, script="t.py", args=())
    assert parse_agent_argv(agent_argv(command)[4:]).options == options


def test_role_is_every_ranks_role_name_and_travels_on_the_agents_command_line() -> None:
    launch = LaunchOptions(role="trainer")
    ranks = node_ranks(TWO_NODES, 1, Rendezvous("h", 1), launch, "t.py", ())
    assert {r.env["ROLE_NAME"] for r in ranks} == {"trainer"}
    assert node_ranks(TWO_NODES, 0, Rendezvous("h", 1), LaunchOptions(), "t.py", ())[0].env["ROLE_NAME"] == "default"
    command = AgentCommand(world=TWO_NODES, node_rank=0, rendezvous=Rendezvous("h", 1, "r"), launch=launch,
                           options=AgentOptions(), script="t.py", args=())
    assert parse_agent_argv(agent_argv(command)[4:]) == command


# --numa-binding over a literal topology: two sockets, one NUMA node each, 4 cores x 2 threads per socket
# (cpu c and c+8 are siblings), GPUs 0,1 on node 0 and GPUs 2,3 on node 1.
FOUR_GPUS = Topology(tuple(Cpu(c, package=(c % 8) // 4, core=c % 4, numa_node=(c % 8) // 4) for c in range(16)))
ALL = frozenset(range(16))


@pytest.mark.parametrize("mode, expected", [
    ("node", ["0-3,8-11", "0-3,8-11", "4-7,12-15", "4-7,12-15"]),
    ("socket", ["0-3,8-11", "0-3,8-11", "4-7,12-15", "4-7,12-15"]),
    ("exclusive", ["0-1,8-9", "2-3,10-11", "4-5,12-13", "6-7,14-15"]),
])
def test_numa_binding_modes_put_each_rank_near_its_gpu(mode: str, expected: list[str]) -> None:
    bindings = plan_numa_binding(FOUR_GPUS, mode, ALL, None, (0, 0, 1, 1))
    assert [format_cpus(b.cpus) for b in bindings] == expected
    assert [b.numa_node for b in bindings] == [0, 0, 1, 1]


def test_numa_binding_socket_spans_the_sockets_nodes() -> None:
    # one socket, two NUMA nodes: socket mode gives both nodes' CPUs, node mode one
    split = Topology(tuple(Cpu(c, package=0, core=c, numa_node=c // 4) for c in range(8)))
    assert [format_cpus(b.cpus) for b in plan_numa_binding(split, "socket", frozenset(range(8)), None, (1,))] == ["0-7"]
    assert [format_cpus(b.cpus) for b in plan_numa_binding(split, "node", frozenset(range(8)), None, (1,))] == ["4-7"]


@pytest.mark.parametrize("gpu_nodes", [None, (), (0, None)])
def test_numa_binding_without_a_gpus_node_is_an_error_as_in_torchrun(gpu_nodes: tuple[int | None, ...] | None) -> None:
    with pytest.raises(BindingError, match="--numa-binding node: needs every rank's GPU"):
        plan_numa_binding(FOUR_GPUS, "node", ALL, None, gpu_nodes)


def test_numa_binding_travels_on_the_agents_command_line() -> None:
    options = AgentOptions(bind_cores=True, numa_binding="socket")
    command = AgentCommand(world=TWO_NODES, node_rank=0, rendezvous=Rendezvous("h", 1, "r"), launch=LaunchOptions(),
                           options=options, script="t.py", args=())
    assert parse_agent_argv(agent_argv(command)[4:]) == command
    assert request("--numa-binding", "exclusive").options.numa_binding == "exclusive"


@pytest.mark.parametrize("text, words", [("apple,orange", ("apple", "orange")), ("a,,b", ("a,b",)), ("", ()),
                                         (",x,", ("x",)), ("a,,,b", ("a,", "b"))])
def test_duplicate_filter_words_as_torchrun_splits_them(text: str, words: tuple[str, ...]) -> None:
    assert parse_filter_list(text) == words
    if words:
        assert parse_filter_list(filter_list(words)) == words


def test_line_copy_copies_whole_matching_lines_across_reads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "filtered.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    copy = LineCopy(fd, (b"loss", b"nan"))
    for chunk in (b"step 1 lo", b"ss 2.0\nstep 2 ok\n", b"grad nan\nlast loss"):
        copy.feed(chunk)
    os.close(fd)
    assert path.read_bytes() == b"step 1 loss 2.0\ngrad nan\n"  # the unfinished last line waits for its end


def test_duplicate_filters_copy_the_ranks_lines_to_the_nodes_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "t.py"
    script.write_text("import os, sys\nprint('loss', os.environ['RANK'])\nprint('ok')\n"
                      "print('warn', os.environ['RANK'], file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-m", "xrun", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "L"),
                           "--duplicate-stdout-filters", "loss", "--duplicate-stderr-filters", "warn", str(script)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    node = tmp_path / "L" / "localhost"
    assert sorted((node / "filtered_stdout.log").read_text().splitlines()) == ["loss 0", "loss 1"]
    assert sorted((node / "filtered_stderr.log").read_text().splitlines()) == ["warn 0", "warn 1"]
    assert "ok" in done.stdout  # the console is unchanged


# core-complex: node 0 holds two L3 caches (CPUs 0-1 with 8-9, 2-3 with 10-11), node 1 one (4-7, 12-15)
CACHES = {**{c: 0 for c in (0, 1, 8, 9)}, **{c: 2 for c in (2, 3, 10, 11)}, **{c: 4 for c in (4, 5, 6, 7, 12, 13, 14, 15)}}


def test_numa_binding_core_complex_deals_each_nodes_caches_to_its_ranks() -> None:
    bindings = plan_numa_binding(FOUR_GPUS, "core-complex", ALL, None, (0, 0, 1, 1), CACHES)
    assert [format_cpus(b.cpus) for b in bindings] == ["0-1,8-9", "2-3,10-11", "4-7,12-15", "4-7,12-15"]
    # a third rank on node 0 wraps round to its first cache, as torch's modulo does
    three = plan_numa_binding(FOUR_GPUS, "core-complex", ALL, None, (0, 0, 0), CACHES)
    assert [format_cpus(b.cpus) for b in three] == ["0-1,8-9", "2-3,10-11", "0-1,8-9"]


def test_read_cache_groups_takes_the_highest_data_or_unified_level(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cpu_dir = tmp_path / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text("0-3\n")
    for cpu in range(4):
        for index, (kind, level, shared) in enumerate([("Data", 1, str(cpu)), ("Instruction", 1, str(cpu)),
                                                       ("Unified", 2, str(cpu)), ("Unified", 3, "0-1" if cpu < 2 else "2-3")]):
            entry = cpu_dir / f"cpu{cpu}" / "cache" / f"index{index}"
            entry.mkdir(parents=True)
            (entry / "type").write_text(kind + "\n")
            (entry / "level").write_text(f"{level}\n")
            (entry / "shared_cpu_list").write_text(shared + "\n")
    assert read_cache_groups(str(tmp_path)) == {0: 0, 1: 0, 2: 2, 3: 2}


def test_the_pet_variables_are_those_torchrun_reads_and_each_is_an_xrun_flag() -> None:
    from torch.distributed.argparse_util import check_env, env  # torch only here: the pure tests run without it
    from torch.distributed.run import get_args_parser

    from xrun.runner.cli import build_parser

    theirs = {a.dest for a in get_args_parser()._actions if isinstance(a, (env, check_env))}
    assert {f.lstrip("-") for f in PET_FLAGS} == theirs
    ours = build_parser()._option_string_actions
    assert all(flag in ours for flag in PET_FLAGS)


def test_pet_variables_are_flag_defaults_and_the_command_line_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "2")
    monkeypatch.setenv("PET_STANDALONE", "1")
    monkeypatch.setenv("PET_ROLE", "trainer")
    monkeypatch.setenv("PET_MAX_RESTARTS", "0")
    read = request()
    assert read.selection.num_gpus == 2 and read.launch.role == "trainer"
    assert not read.launch.local_rank_arg  # a PET_ flag is a torchrun flag: torchrun's form, no --local_rank
    assert request("--nproc-per-node=3", "--role", "x").selection.num_gpus == 3
    assert request("--nproc-per-node=3", "--role", "x").launch.role == "x"
    monkeypatch.delenv("PET_NPROC_PER_NODE")
    monkeypatch.delenv("PET_ROLE")
    monkeypatch.delenv("PET_STANDALONE")
    monkeypatch.delenv("PET_MAX_RESTARTS")
    monkeypatch.setenv("PET_MASTER_PORT", "29555")  # a flag xrun has too: still torchrun's run, no --local_rank
    assert request().master_port == 29555 and not request().launch.local_rank_arg
    monkeypatch.setenv("PET_STANDALONE", "0")
    monkeypatch.setenv("PET_TEE", "3")
    assert request().options.log_dir is not None


@pytest.mark.parametrize("variable, value, says", [
    ("PET_NPROC_PER_NODE", "x", "PET_NPROC_PER_NODE: 'x': 'x' is not a whole number"),
    ("PET_STANDALONE", "yes", "PET_STANDALONE: 'yes' is not 0 or 1"),
    ("PET_START_METHOD", "thread", "PET_START_METHOD: 'thread' is not one of spawn, fork, forkserver"),
    ("PET_MASTER_PORT", "99999", "PET_MASTER_PORT (--master_port): 99999 is not a TCP port"),
    ("PET_REDIRECTS", "0:4", "PET_REDIRECTS (--redirects): '0:4' is not 0-3"),
    ("PET_LOCAL_RANKS_FILTER", "x", "PET_LOCAL_RANKS_FILTER (--local-ranks-filter): 'x'"),
])
def test_a_bad_pet_value_is_one_usage_error(monkeypatch: pytest.MonkeyPatch, variable: str, value: str,
                                            says: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(UsageError) as caught:
        request()
    assert str(caught.value).startswith(says), str(caught.value)


def test_a_kubeflow_pods_pet_shape_is_the_platforms_not_the_flags(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path) -> None:  # type: ignore[no-untyped-def]
    """PET_NNODES set: the platform (xrun.runner.pod.platforms) reads the nodes, node rank, master and slots; the
    flag defaults leave them to it (both reading them would plan pod mode twice); other PET_* still apply."""
    for name, value in {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "10.0.0.1",
                        "PET_MASTER_PORT": "23456", "PET_NPROC_PER_NODE": "2", "PET_ROLE": "trainer"}.items():
        monkeypatch.setenv(name, value)
    read = request()
    assert read.selection.num_gpus is None and read.master_addr is None and read.torchrun.nnodes is None
    assert read.launch.role == "trainer"
    # and the platform plans the pod from them: node 1 of 2, 2 slots, node 0 at PET_MASTER_ADDR
    (tmp_path / "t.py").write_text("")
    done = subprocess.run([sys.executable, "-m", "xrun", "--dry-run=json", "t.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)  # the PET_* above are in os.environ
    assert done.returncode == 0, done.stderr
    assert ("Kubeflow (PET_NNODES, PET_NODE_RANK): node 1 of 2, master 10.0.0.1:23456; 2 slot(s) per node from "
            "PET_NPROC_PER_NODE") in done.stderr


def test_a_bad_pet_value_is_one_line_and_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PET_NPROC_PER_NODE": "x"}
    done = subprocess.run([sys.executable, "-m", "xrun", "t.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["xrun: PET_NPROC_PER_NODE: 'x': 'x' is not a whole number (ASCII digits); "
                                        "or one of auto, gpu, cpu"]
