"""Issue 41 on namespace hosts: torchrun's multi-node form, one launcher per node (``--nnodes 2 --node_rank K
--master_addr A --master_port P``), run with torch's torchrun and then with xrun (the word swapped), the same
script; compared per rank: exit codes, the env contract (ports and run ids by presence), argv, and which ranks'
lines reach each node's console."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytest.importorskip("torch.distributed.run")

MARK = "XRUN_TEST_MARK"
PORT = 29760
SAME_VALUE = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
              "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
SAME_PRESENCE = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
SCRIPT = """\
import json, os, sys
env = {k: v for k, v in os.environ.items() if k in KEYS}
with open(os.path.join(os.environ["DUMP_DIR"], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"name": __name__, "argv": sys.argv[1:], "env": env}, f)
print("out of rank %s" % os.environ["RANK"], flush=True)
"""


def _run(cluster, launcher: list[str], flags: list[str], tmp: Path, out: Path, port: int) -> dict:
    out.mkdir()
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": ROOT, MARK: mark, "DUMP_DIR": str(out)}
    procs = []
    for k in range(2):
        argv = [*launcher, "--nnodes", "2", "--node_rank", str(k), "--master_addr", cluster.nodes[0].name,
                "--master_port", str(port), *flags, "dump.py", "--lr", "3e-4"]
        procs.append(cluster.popen_on(cluster.nodes[k].name, argv, env=env, cwd=str(tmp), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    done = [(p.wait(timeout=120), p.stdout.read() if p.stdout else "") for p in procs]
    return {
        "codes": [code for code, _ in done],
        "console": [sorted(int(n) for n in re.findall(r"out of rank (\d+)", text)) for _, text in done],
        "ranks": {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")},
        "text": "\n".join(text for _, text in done),
    }


def test_torchrun_multinode_line_runs_alike_under_xrun_one_launcher_per_node(cluster, tmp_path):
    (tmp_path / "dump.py").write_text(SCRIPT.replace("KEYS", repr((*SAME_VALUE, *SAME_PRESENCE))))
    flags = ["--nproc_per_node", "2", "--role", "trainer", "--local-ranks-filter", "1"]
    torchrun = _run(cluster, [sys.executable, "-m", "torch.distributed.run"], flags, tmp_path, tmp_path / "t", PORT)
    xrun = _run(cluster, [sys.executable, "-m", "xrun"], flags, tmp_path, tmp_path / "x", PORT + 10)
    assert torchrun["codes"] == [0, 0], torchrun["text"][-3000:]
    assert xrun["codes"] == [0, 0], xrun["text"][-3000:]
    assert sorted(xrun["ranks"]) == sorted(torchrun["ranks"]) == [0, 1, 2, 3]
    for rank in range(4):
        theirs, ours = torchrun["ranks"][rank], xrun["ranks"][rank]
        assert ours["name"] == theirs["name"] == "__main__"
        assert ours["argv"] == theirs["argv"] == ["--lr", "3e-4"]
        for key in SAME_VALUE:
            assert ours["env"].get(key) == theirs["env"].get(key), (rank, key)
        for key in SAME_PRESENCE:
            assert (key in ours["env"]) == (key in theirs["env"]), (rank, key)
    # Local rank 1 of each node reaches the console, local rank 0 nowhere. torchrun: each node's console shows its
    # own ranks; xrun's pod mode: node 0 is also the job's console, so it shows node 1's rank too.
    assert torchrun["console"] == [[1], [3]]
    assert xrun["console"] == [[1, 3], [3]]
