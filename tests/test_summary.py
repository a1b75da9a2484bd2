"""Every rank summarised (issue 14, item 4): the pure wording from literal figures, then real runs."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_xrun
from tests.test_control import run_job
from xrun.common.result.summary import RankFigures, format_bytes, seconds, success_line, summary_json, table_lines

GIB = 1024**3


def figures(rank: int, *, rss: int | None = 100 * 1024**2, wall: float = 1.0, ok: bool = True) -> RankFigures:
    return RankFigures(host=f"node{rank // 2}", rank=rank, local_rank=rank % 2, wall_s=wall, cpu_s=0.5,
                       peak_rss_bytes=rss, status="exit code 0" if ok else "exit code 3", ok=ok)


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (980 * 1024, "980 KiB"),
     (312 * 1024**2, "312 MiB"), (int(4.1 * GIB), "4.1 GiB"), (2048 * GIB, "2048 GiB")],
)
def test_format_bytes(count, text):
    assert format_bytes(count) == text


@pytest.mark.parametrize(("value", "text"), [(0.414, "0.41 s"), (12.34, "12.3 s"), (312.4, "312 s")])
def test_seconds(value, text):
    assert seconds(value) == text


@pytest.mark.parametrize(
    ("ranks", "line"),
    [
        ([figures(r, wall=300 + r) for r in range(16)], "16 ranks ok in 315 s; peak RSS 100 MiB (rank 0)"),
        ([figures(0), figures(3, rss=int(4.1 * GIB), wall=312.0), figures(1)],
         "3 ranks ok in 312 s; peak RSS 4.1 GiB (rank 3)"),
        ([figures(0, rss=None)], "1 rank ok in 1.00 s"),  # elastic: no rusage, no RSS claim
    ],
)
def test_success_line(ranks, line):
    assert success_line(ranks) == line


def test_table_has_every_rank_in_rank_order_with_unknowns_as_dashes():
    lines = table_lines([figures(2, ok=False), figures(0, rss=None), figures(1)])
    assert lines[0].split() == ["rank", "host", "local", "wall", "cpu", "peak", "RSS", "status"]
    assert [line.split()[0] for line in lines[1:]] == ["0", "1", "2"]
    assert lines[1].split()[7] == "-"  # rank 0 wall "1.00 s" cpu "0.50 s" then RSS
    assert lines[3].endswith("exit code 3")
    assert len({line.index("status") if i == 0 else line.index("exit") for i, line in enumerate(lines)}) == 1


def test_figures_survive_the_wire_and_malformed_ones_are_refused():
    original = figures(5)
    assert RankFigures.from_json(json.loads(json.dumps(original.to_json()))) == original
    for broken in ({}, {**original.to_json(), "rank": "5"}, {**original.to_json(), "peak_rss_bytes": True}):
        with pytest.raises(ValueError):
            RankFigures.from_json(broken)


def test_summary_json_counts_the_ranks_that_ended_well():
    data = summary_json([figures(1, ok=False), figures(0)], exit_code=3)
    assert data["exit_code"] == 3 and data["ranks_ok"] == 1 and [r["rank"] for r in data["ranks"]] == [0, 1]


BURN = """
import os, sys
block = bytearray(int(os.environ["RANK"]) * 40_000_000 + 1)  # touched: counts in the peak RSS
for i in range(0, len(block), 4096):
    block[i] = 1
total = 0
for i in range(3_000_000):  # CPU time the kernel accounts to this rank
    total += i
sys.exit(int(os.environ.get("CODE_" + os.environ["RANK"], "0")))
"""


def test_a_local_run_says_one_line_and_writes_summary_json(tmp_path):
    script = tmp_path / "burn.py"
    script.write_text(BURN)
    result = run_xrun("--num_gpus", "3", "--log_dir", str(tmp_path / "logs"), str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    line = [x for x in result.stderr.splitlines() if "ranks ok" in x]
    assert len(line) == 1 and line[0].startswith("xrun[localhost]: 3 ranks ok in ") and line[0].endswith("(rank 2)")
    data = json.loads((tmp_path / "logs" / "localhost" / "summary.json").read_text())
    assert data["exit_code"] == 0 and data["ranks_ok"] == 3
    ranks = data["ranks"]
    assert all(r["cpu_s"] > 0.05 and r["wall_s"] >= r["cpu_s"] * 0.5 for r in ranks)
    # 80 MB more, touched. A rank's peak counts what it shared with xrun between fork and exec (the local head's
    # ~25 MiB, in every rank alike), which lifts a small rank's peak more than a large one's: the gap is a bit less.
    assert ranks[2]["peak_rss_bytes"] - ranks[0]["peak_rss_bytes"] > 60_000_000


def test_a_failed_local_run_has_the_table_in_its_report(tmp_path):
    script = tmp_path / "burn.py"
    script.write_text(BURN)
    result = run_xrun("--num_gpus", "2", "--log_dir", str(tmp_path / "logs"), str(script), cwd=tmp_path,
                      env={"CODE_1": "3"})
    assert result.returncode == 3
    assert "ranks ok" not in result.stderr
    table = result.stderr[result.stderr.index("  rank  host") :].splitlines()
    assert table[2].split()[0] == "1" and table[2].endswith("exit code 3")
    failure = json.loads((tmp_path / "logs" / "localhost" / "failure.json").read_text())
    assert failure["ranks"][1]["cpu_s"] > 0 and failure["ranks"][1]["peak_rss_bytes"] > 0
    assert json.loads((tmp_path / "logs" / "localhost" / "summary.json").read_text())["exit_code"] == 3


def test_the_head_sums_up_every_node_in_one_line(tmp_path, capsys):
    code, out, server, _ = run_job(tmp_path, {})
    assert code == 0, out
    assert sorted(f.rank for f in server.figures.ranks) == [0, 1, 2, 3]
    assert {f.host for f in server.figures.ranks} == {"a", "b", "c"}
    err = capsys.readouterr().err
    assert err.count("ranks ok") == 1 and "xrun: 4 ranks ok in " in err
    assert "ranks ok" not in out  # the agents leave it to the head
