"""Issue 41: real torchrun lines, run with torch's own torchrun and with xrun (the word swapped), the same script;
compared per rank: the exit code, the env contract (ports, run ids and paths by presence), argv, ``__name__`` under
``-m``, and which ranks' lines reach the console. Each line runs torchrun once (about 3 s: it imports torch)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed.run")

pytestmark = pytest.mark.slow

RANKS = 2
# What every rank must see alike from both launchers: by value ...
SAME_VALUE = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
              "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
# ... and by presence: an address, a port, an id or a path each launcher chooses (OMP_NUM_THREADS: torchrun 1,
# xrun the CPUs per rank).
SAME_PRESENCE = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS")

DUMP = """\
import json, os, sys
env = {k: v for k, v in os.environ.items() if k in KEYS}
record = {"name": __name__, "argv": sys.argv[1:], "env": env}
with open(os.path.join(os.environ["DUMP_DIR"], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(record, f)
print("out of rank %s" % os.environ["RANK"], flush=True)
print("err of rank %s" % os.environ["RANK"], file=sys.stderr, flush=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _lines(port: int) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (launcher flags, the program and its args): the issue's table, at 2 CPU ranks."""
    return {
        # torchtitan run_train.sh
        "torchtitan": (["--nproc_per_node=2", "--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0",
                        "--local-ranks-filter", "0", "--role", "rank", "--tee", "3"],
                       ["-m", "dumpmod", "--job.config_file", "./train_configs/debug_model.toml"]),
        # torchchat dist_run.sh
        "torchchat": (["--nproc-per-node=2", f"--master_port={port}", "--local-ranks-filter", "0,1", "--role", "rank",
                       "--tee", "3"], ["dump.py", "llama3", "--pp", "1"]),
        # nanoGPT's README
        "nanogpt": (["--standalone", "--nproc_per_node=2"], ["dump.py"]),
        # torch's docs (torchrun.html, single node)
        "torchdocs": (["--nnodes", "1", "--nproc_per_node", str(RANKS), "--rdzv_id", "job42", "--rdzv_backend", "c10d",
                       "--rdzv_endpoint", f"localhost:{port}"], ["dump.py", "--lr", "3e-4"]),
        # beyond the table: torchrun's other console and rank flags
        "redirects": (["--nproc_per_node=2", "-r", "0:3", "--run-path", "--start-method", "fork"], ["dump.py", "x"]),
        "redirects-stdout": (["--nproc_per_node=2", "--redirects", "1"], ["dump.py"]),  # every rank's stderr only
        "redirects-0-stderr": (["--nproc_per_node=2", "--redirects", "0:2"], ["dump.py"]),  # all but rank 0's stderr
        # an elastic range (torch's agent on every node): one node joins, the filter holds under it too
        "elastic-filter": (["--nnodes", "1:2", "--nproc_per_node=2", "--rdzv_backend", "c10d",
                            f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_conf", "last_call_timeout=1",
                            "--local-ranks-filter", "0", "--duplicate-stdout-filters", "out"], ["dump.py"]),
        "virtual": (["--standalone", "--nproc-per-node", "2", "--virtual-local-rank", "--signals-to-handle",
                     "SIGTERM,SIGINT,SIGUSR1"], ["-m", "dumpmod"]),
    }


def _run(launcher: list[str], flags: list[str], program: list[str], workdir: Path, out: Path,
         pet: dict[str, str] | None = None) -> dict[str, Any]:
    out.mkdir()
    env = {**os.environ, "DUMP_DIR": str(out), "PYTHONPATH": str(workdir), **(pet or {})}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run([*launcher, *flags, *program], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    ranks = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    return {
        "rc": done.returncode,
        "ranks": ranks,
        "stdout_ranks": sorted({int(n) for n in re.findall(r"out of rank (\d+)", done.stdout + done.stderr)}),
        "stderr_ranks": sorted({int(n) for n in re.findall(r"err of rank (\d+)", done.stdout + done.stderr)}),
        "stderr": done.stderr,
    }


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torchrun-lines")
    code = DUMP.replace("KEYS", repr((*SAME_VALUE, *SAME_PRESENCE)))
    (root / "dump.py").write_text(code)
    (root / "dumpmod.py").write_text(code)
    return root


# torchrun's PET_* variables as its flags' defaults (torch.distributed.argparse_util), the command line winning
PET_LINES = {
    "pet-nproc": ({"PET_NPROC_PER_NODE": "2"}, []),
    "pet-standalone-redirects": ({"PET_STANDALONE": "1", "PET_NPROC_PER_NODE": "1", "PET_REDIRECTS": "1"},
                                 ["--nproc_per_node", "2"]),
}


@pytest.mark.parametrize("name", ["torchtitan", "torchchat", "nanogpt", "torchdocs", "redirects", "redirects-stdout",
                                  "redirects-0-stderr", "elastic-filter", "virtual", *PET_LINES])
def test_a_torchrun_line_runs_alike_under_xrun(name: str, workdir: Path, tmp_path: Path) -> None:
    flags, program = _lines(free_port()).get(name, ([], ["dump.py"]))
    pet: dict[str, str] = {}
    if name in PET_LINES:
        pet, flags = PET_LINES[name]
    torchrun = _run([sys.executable, "-m", "torch.distributed.run"], flags, program, workdir, tmp_path / "torchrun",
                    pet)
    xrun = _run([sys.executable, "-m", "xrun"], flags, program, workdir, tmp_path / "xrun", pet)
    assert torchrun["rc"] == 0, torchrun["stderr"][-2000:]
    assert xrun["rc"] == torchrun["rc"], xrun["stderr"][-2000:]
    assert sorted(xrun["ranks"]) == sorted(torchrun["ranks"]) == list(range(RANKS))
    for rank in range(RANKS):
        theirs, ours = torchrun["ranks"][rank], xrun["ranks"][rank]
        assert ours["name"] == theirs["name"] == "__main__"
        assert ours["argv"] == theirs["argv"] == program[2 if program[0] == "-m" else 1:]
        for key in SAME_VALUE:
            assert ours["env"].get(key) == theirs["env"].get(key), (rank, key)
        for key in SAME_PRESENCE:
            assert (key in ours["env"]) == (key in theirs["env"]), (rank, key)
        if "--rdzv_id" in flags:  # a run id given is the run id
            assert ours["env"]["TORCHELASTIC_RUN_ID"] == theirs["env"]["TORCHELASTIC_RUN_ID"]
    assert xrun["stdout_ranks"] == torchrun["stdout_ranks"]
    assert xrun["stderr_ranks"] == torchrun["stderr_ranks"]
    if {"--tee", "--redirects", "-r"} & set(flags) or "PET_REDIRECTS" in pet:  # every rank's output is in a log file, under the directory xrun names
        found = re.search(r"per-rank logs under (\S+)", xrun["stderr"])
        assert found is not None, xrun["stderr"]
        logged = "".join(p.read_text() for p in Path(found.group(1)).rglob("*.log"))
        assert all(f"out of rank {r}" in logged and f"err of rank {r}" in logged for r in range(RANKS))
    if "--duplicate-stdout-filters" in flags:  # every rank's line with the word, in the node's file
        found = re.search(r"per-rank logs under (\S+)", xrun["stderr"])
        assert found is not None, xrun["stderr"]
        copied = "".join(p.read_text() for p in Path(found.group(1)).rglob("filtered_stdout.log"))
        assert sorted(copied.splitlines()) == [f"out of rank {r}" for r in range(RANKS)]


def _run_two(launcher: list[str], flags: list[str], workdir: Path, out: Path) -> dict[str, Any]:
    """Two launchers at once on this machine, as torchrun's multi-node docs line is started on every node."""
    out.mkdir()
    env = {**os.environ, "DUMP_DIR": str(out), "PYTHONPATH": str(workdir)}
    procs = [subprocess.Popen([*launcher, *flags, "dump.py", "--lr", "3e-4"], cwd=workdir, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    texts = [p.communicate(timeout=120)[0] for p in procs]
    ranks = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    return {"codes": [p.returncode for p in procs], "ranks": ranks, "text": "\n".join(texts),
            "console": sorted(int(n) for n in re.findall(r"out of rank (\d+)", "\n".join(texts)))}


def test_the_c10d_multinode_line_started_twice_runs_alike_under_xrun(workdir: Path, tmp_path: Path) -> None:
    """torch's docs: ``torchrun --nnodes 2 --nproc_per_node 1 --rdzv_id ID --rdzv_backend c10d --rdzv_endpoint H:P``
    on every node, no --node_rank: torch numbers the nodes as they join (xrun: torch's elastic agent)."""
    def flags(port: int) -> list[str]:
        return ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_id", "job42", "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"127.0.0.1:{port}"]
    torchrun = _run_two([sys.executable, "-m", "torch.distributed.run"], flags(free_port()), workdir,
                        tmp_path / "torchrun")
    xrun = _run_two([sys.executable, "-m", "xrun"], flags(free_port()), workdir, tmp_path / "xrun")
    assert torchrun["codes"] == [0, 0], torchrun["text"][-3000:]
    assert xrun["codes"] == [0, 0], xrun["text"][-3000:]
    assert sorted(xrun["ranks"]) == sorted(torchrun["ranks"]) == [0, 1]
    for rank in range(2):
        theirs, ours = torchrun["ranks"][rank], xrun["ranks"][rank]
        assert ours["name"] == theirs["name"] == "__main__"
        assert ours["argv"] == theirs["argv"] == ["--lr", "3e-4"]
        for key in SAME_VALUE:
            assert ours["env"].get(key) == theirs["env"].get(key), (rank, key)
        for key in SAME_PRESENCE:
            assert (key in ours["env"]) == (key in theirs["env"]), (rank, key)
        assert ours["env"]["TORCHELASTIC_RUN_ID"] == theirs["env"]["TORCHELASTIC_RUN_ID"] == "job42"
    assert xrun["console"] == torchrun["console"] == [0, 1]
