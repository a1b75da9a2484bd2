"""The benchmark suite's pure parts: statistics, round order, rendering, the README splice, knobs.

Benchmarks measure; these tests only check behaviour. Nothing here times anything or starts a launcher.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
from dataclasses import replace

import pytest

from bench import harness, procs, report
from bench.launchers import LAUNCHERS, LocalJob, floor_argv
from bench.scenarios import SCENARIOS, resolve
from bench.scenarios.base import Context, target

# ---------------------------------------------------------------------------------------------------------------
# Statistics


def test_summarize_median_min_max():
    st = harness.summarize([3.0, 1.0, 2.0, 10.0])
    assert (st["median"], st["min"], st["max"], st["n"], st["censored"]) == (2.5, 1.0, 10.0, 4, 0)


def test_summarize_censored_values_rank_above_everything():
    st = harness.summarize([1.0, None, 2.0], censor_at=8.0)
    assert st["median"] == 2.0 and st["max"] is None and st["censored"] == 1 and st["censor_at"] == 8.0


def test_summarize_censored_median_is_unknown():
    st = harness.summarize([None, None, 1.0], censor_at=8.0)
    assert st["median"] is None and st["min"] == 1.0


def test_summarize_empty():
    assert harness.summarize([])["median"] is None


def test_paired_ratios_are_taken_within_rounds():
    # Round 2 is slow for both: the per-round ratio stays 2 where a ratio of medians would not.
    st = harness.paired_ratios([2.0, 20.0, 4.0], [1.0, 10.0, 2.0])
    assert st["median"] == 2.0 and st["min"] == 2.0 and st["max"] == 2.0


def test_paired_ratios_skip_rounds_without_both_values():
    st = harness.paired_ratios([2.0, None, 9.0], [1.0, 1.0, None])
    assert st["n"] == 1 and st["median"] == 2.0


def test_schedule_first_round_in_order_then_permutations():
    names = ["floor", "xrun", "torchrun", "deepspeed"]
    plan = harness.schedule(names, 6, random.Random(1))
    assert len(plan) == 6 and plan[0] == names
    assert all(sorted(r) == sorted(names) for r in plan)
    assert plan == harness.schedule(names, 6, random.Random(1))  # reproducible from the seed
    assert any(r != names for r in plan[1:])


def test_run_rounds_runs_every_variant_once_per_round():
    seen = []

    def trial(name: str) -> harness.Trial:
        seen.append(name)
        return harness.Trial(metrics={"wall_s": float(len(name))})

    out = harness.run_rounds(["a", "bb"], 3, trial, rng=random.Random(0), label="t")
    assert sorted(seen) == ["a", "a", "a", "bb", "bb", "bb"]
    assert [t.metrics["wall_s"] for t in out["bb"]] == [2.0, 2.0, 2.0]


def test_summarize_group_ratios_to_floor_and_xrun():
    results = {
        "floor": [harness.Trial(metrics={"wall_s": 1.0}), harness.Trial(metrics={"wall_s": 2.0})],
        "xrun": [harness.Trial(metrics={"wall_s": 1.5}), harness.Trial(metrics={"wall_s": 3.0})],
    }
    group = harness.summarize_group(results)
    assert group["variants"]["xrun"]["vs_floor"]["wall_s"]["median"] == 1.5
    assert group["variants"]["floor"]["vs_xrun"]["wall_s"]["median"] == pytest.approx(2 / 3)
    assert "vs_floor" not in group["variants"]["floor"]


# ---------------------------------------------------------------------------------------------------------------
# Rendering


def _section() -> dict:
    results = {
        "floor": [harness.Trial(metrics={"wall_s": 0.05, "leftovers": 0.0}, exit_code=0)] * 2,
        "xrun": [harness.Trial(metrics={"wall_s": 0.2, "leftovers": 0.0}, exit_code=0)] * 2,
        "deepspeed": [
            harness.Trial(
                metrics={"wall_s": None, "leftovers": 2.0},
                exit_code=None,
                error="killed at the deadline",
                notes={"leftovers": ["python -u x.py"]},
            )
        ]
        * 2,
    }
    return {
        "name": "launch",
        "title": "1. Launch",
        "status": "ok",
        "date": "2026-01-01T00:00:00+00:00",
        "params": {"rounds": 2},
        "load_before": [1.0, 1.0, 1.0],
        "load_after": [1.5, 1.0, 1.0],
        "duration_s": 3.0,
        "table": {"metrics": [["wall_s", "launch→exit", "s"]], "ratio": "wall_s", "reference": "floor"},
        "groups": [{"label": "N=4", "params": {"nproc": 4}, **harness.summarize_group(results, censor_at=9.0)}],
        "targets": [target("xrun / floor", 4.0, 2.0, "×")],
        "skipped": {"torchrun": "torchrun not on PATH"},
    }


def test_render_section_table_and_notes():
    text = report.render_section(_section())
    assert "| N=4 | xrun | 0.2 s [0.2–0.2] | 4× | 1× | 0 | 0 |" in text
    assert "| N=4 | deepspeed | > 9 s | – | – | – | 2 max |" in text
    assert "**MISSED**: xrun / floor ≤ 2×: 4×" in text
    assert "skipped torchrun --standalone: torchrun not on PATH" in text
    assert "error, N=4 deepspeed: killed at the deadline" in text
    assert "left behind, N=4 deepspeed: `python -u x.py`" in text


def test_render_unavailable_section():
    sec = {"title": "7. Fan-out", "status": "not available: no cluster", "params": {}}
    assert "**not available: no cluster**" in report.render_section(sec)


def test_fmt_value():
    assert report.fmt_value(harness.summarize([0.0123]), "s") == "0.0123 s"
    assert report.fmt_value(harness.summarize([1.0, 2.0, 30.0]), "MiB") == "2 MiB [1–30]"
    assert report.fmt_value(harness.summarize([None], censor_at=8.0), "s") == "> 8 s"
    assert report.fmt_value(None, "s") == "–"


def test_render_markdown_has_machine_and_versions():
    doc = {
        "meta": {
            "date": "2026-01-01T00:00:00+00:00",
            "machine": {"cpu": "X", "cores": 2, "mem_gib": 24, "system": "Linux", "kernel": "6"},
            "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "deepspeed": None},
        },
        "scenarios": {"launch": _section()},
    }
    text = report.render_markdown(doc)
    assert "2 cores" in text and "torch 2.13.0+cpu" in text and "deepspeed" not in text.split("\n")[2]
    assert "## 1. Launch" in text


def test_update_readme_replaces_only_the_block():
    readme = f"intro\n{report.README_START}\nold\n{report.README_END}\noutro\n"
    out = report.update_readme(readme, "# title\n\nnew table\n## 1. Launch\n", "results/latest.png")
    assert out.startswith("intro\n") and out.endswith("\noutro\n")
    assert "new table" in out and "old" not in out and "# title" not in out
    assert "![latest results](results/latest.png)" in out and "\n### 1. Launch\n" in out
    assert report.update_readme(out, "# t\n\nnewer\n", "p.png").count(report.README_START) == 1


def test_merge_keeps_scenarios_not_rerun():
    old = {"meta": {"date": "old"}, "scenarios": {"launch": {"v": 1}, "memory": {"v": 1}}}
    new = {"meta": {"date": "new"}, "scenarios": {"failure": {"v": 2}, "launch": {"v": 2}}}
    merged = report.merge(old, new)
    assert list(merged["scenarios"]) == ["launch", "failure", "memory"]
    assert merged["scenarios"]["launch"] == {"v": 2} and merged["meta"]["date"] == "new"


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    doc = {"meta": {"date": "2026-01-01", "machine": {"cores": 2}}, "scenarios": {"launch": _section()}}
    path = tmp_path / "p.png"
    assert report.plot(doc, str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------------------------------------------------
# Scenarios, knobs, launchers


def test_resolve_names_numbers_and_groups():
    assert resolve("1,memory") == ["launch", "memory"]
    assert resolve("local") == ["launch", "torch_start", "failure", "signal", "memory", "logging"]
    assert resolve("all") == list(SCENARIOS) and len(SCENARIOS) == 9
    with pytest.raises(ValueError, match="unknown scenario 'nope'; known: 1=launch"):
        resolve("nope")


def test_context_options_and_rounds():
    ctx = Context(quick=False, options={"nproc": "2,4", "cap_s": "3"})
    assert ctx.option("nproc", (1,), (1, 2, 4, 8)) == (2, 4)
    assert ctx.option("cap_s", 5.0, 10.0) == 3.0
    assert ctx.option("bytes", 1, 20) == 20
    assert Context(quick=True).option("bytes", 1, 20) == 1
    assert Context(quick=True).rounds(1, 5) == 1 and Context(reps=7).rounds(1, 5) == 7


def test_context_pick_skips_filtered_launchers():
    run, skipped = Context(launchers=("xrun",)).pick(["floor", "torchrun", "deepspeed"])
    assert "floor" in run and skipped == {"torchrun": "not selected", "deepspeed": "not selected"}


WEIRD = ("a b", "it's", 'q"uote', "$HOME", "x;echo hi", "")


def test_floor_argv_passes_arguments_through_bash(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os, sys\n"
        "with open(os.path.join(os.path.dirname(__file__), os.environ['RANK']), 'w') as f:\n"
        "    json.dump([os.environ['WORLD_SIZE'], os.environ['MASTER_PORT'], sys.argv[1:]], f)\n"
    )
    subprocess.run(floor_argv(LocalJob(nproc=2, script=str(script), args=WEIRD, master_port=1)), check=True)
    for rank in ("0", "1"):
        assert json.loads((tmp_path / rank).read_text()) == ["2", "1", list(WEIRD)]


@pytest.mark.parametrize("own_sessions", [False, True])
def test_floor_argv_exit_code_is_a_failing_ranks(tmp_path, own_sessions):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nsys.exit(7 if os.environ['RANK'] == '1' else 0)\n")
    argv = floor_argv(LocalJob(nproc=3, script=str(script), args=(), master_port=1), own_sessions=own_sessions)
    assert subprocess.run(argv).returncode == 7


def test_the_floors_ranks_can_each_have_a_session_of_their_own(tmp_path):
    script = tmp_path / "where.py"
    # one write per rank (python -u writes print's words one by one, and the two ranks share the pipe)
    script.write_text("import os, sys\nsys.stdout.write(f'{os.getsid(0) == os.getpid()} {os.getppid() != 1}\\n')\n")
    for own_sessions, leader in ((False, "False"), (True, "True")):
        argv = floor_argv(LocalJob(nproc=2, script=str(script), args=(), master_port=1), own_sessions=own_sessions)
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split("\n")
        assert sorted(out[:2]) == [f"{leader} True"] * 2  # setsid ran python in place: bash waits for the rank


def test_launcher_argv_shapes():
    job = LocalJob(nproc=4, script="/s.py", args=("k=v",), master_port=1234, log_dir="/l")
    assert LAUNCHERS["torchrun"].argv(job) == [
        "torchrun",
        "--standalone",
        "--nproc_per_node",
        "4",
        "--log-dir",
        "/l",
        "--tee",
        "3",
        "/s.py",
        "k=v",
    ]
    assert LAUNCHERS["deepspeed"].argv(job)[:5] == ["deepspeed", "--num_gpus", "4", "--master_port", "1234"]
    assert shlex.join(LAUNCHERS["xrun"].argv(job)).startswith("xrun --num_gpus 4")


def test_the_preload_scenarios_variants_differ_only_by_their_flags():
    from bench.scenarios import preload

    job = LocalJob(nproc=4, script="/s.py", args=("k=v",), master_port=1234)
    plain, forked = preload.launcher_argv("xrun", job, restarts=1), preload.launcher_argv("xrun:preload", job, restarts=1)
    assert forked == [*plain[:-2], "--preload", "torch", *plain[-2:]] and "--max_restarts" in plain
    assert "--preload" not in preload.launcher_argv("xrun", job)
    assert preload.launcher_argv("torchrun", job, restarts=1)[:3] == ["torchrun", "--max-restarts", "1"]


# ---------------------------------------------------------------------------------------------------------------
# /proc helpers, on this very process and one short-lived child


def test_procs_sees_a_tagged_child_and_its_zombie_as_dead(tmp_path):
    tag = procs.new_tag()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", tag],
        stdin=subprocess.PIPE,
        env={**os.environ, procs.TAG_ENV: tag},
    )
    try:
        assert procs.tagged_pids(tag) == [child.pid]
        assert procs.is_alive(child.pid) and procs.status_kib(child.pid) > 0
        assert not procs.runs_script(child.pid, str(tmp_path))
        child.stdin.close()
        while procs.is_alive(child.pid):  # becomes a zombie: not reaped yet, but dead to us
            pass
        assert os.path.exists(f"/proc/{child.pid}") and procs.tagged_pids(tag) == []
    finally:
        child.wait()


def test_rank_pids_reads_the_pid_files(tmp_path):
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "123").write_text("1700000000.5 0\n")
    (tmp_path / "ranks" / "124").write_text("")  # a rank caught mid-write is skipped
    assert procs.rank_pids(str(tmp_path)) == {123: 1700000000.5}


def test_generations_group_the_ranks_start_times_by_restart_count(tmp_path):
    (tmp_path / "ranks").mkdir()
    for pid, line in [(1, "10.0 0 0"), (2, "10.5 1 0"), (3, "20.0 0 1"), (4, "21.0 1 1"), (5, "")]:
        (tmp_path / "ranks" / str(pid)).write_text(line)  # 5: a rank caught mid-write is skipped
    assert {k: sorted(v) for k, v in harness.generations(str(tmp_path)).items()} == {0: [10.0, 10.5], 1: [20.0, 21.0]}


def test_restart_timing_from_the_cause_to_the_last_restarted_rank_and_the_exit():
    got = harness.JobRun(wall_s=15.0, exit_code=0, first_rank_s=None, last_rank_s=None, ranks_started=4,
                         leftovers=[], peak_kib={}, started_at=100.0)
    trial = harness.restart_timing(got, [111.0, 112.5], 110.0, ranks=2, cause="-", after="-", tail="")
    assert trial.metrics == {"restart_s": 2.5, "exit_s": 5.0, "leftovers": 0.0} and trial.error is None
    killed = replace(got, wall_s=None, exit_code=None, leftovers=["rank"])  # the deadline: killed, a rank left
    trial = harness.restart_timing(killed, [111.0, 112.5], 110.0, ranks=2, cause="-", after="the replacement",
                                   tail="t")
    assert trial.metrics["exit_s"] is None and trial.notes == {"leftovers": ["rank"]}
    assert trial.error == "exit None after the replacement | console: 't'"


def test_restart_timing_without_the_cause_or_every_rank_is_an_error_without_figures():
    got = harness.JobRun(wall_s=15.0, exit_code=1, first_rank_s=None, last_rank_s=None, ranks_started=4,
                         leftovers=[], peak_kib={}, started_at=100.0)
    trial = harness.restart_timing(got, [111.0], 110.0, ranks=2, cause="failure seen", after="-", tail="t")
    assert trial.metrics == {} and trial.error == "1 of 2 ranks restarted, failure seen, exit 1 | console: 't'"
    trial = harness.restart_timing(got, [111.0, 112.0], None, ranks=2, cause="node2 never killed", after="-", tail="")
    assert trial.metrics == {} and trial.error.startswith("2 of 2 ranks restarted, node2 never killed, exit 1")


def test_scale_scenarios_run_by_name_outside_all():
    assert resolve("scale") == ["agent_start", "control_plane", "telemetry_head"]
    assert resolve("control_plane,1") == ["control_plane", "launch"]
    assert "agent_start" not in resolve("all")


def test_the_head_telemetry_bench_feeds_the_heads_code_and_it_names_the_late_rank():
    from bench.scenarios.telemetry_head import Traffic, head_minute

    traffic = Traffic(40, 8, 20.0, 120.0, seed=3)
    figures = head_minute(traffic, 1)
    assert figures["named"] == 1.0 and figures["scored"] >= 12, figures
    parts = sum(figures[k] for k in ("decode_s", "read_s", "score_s", "clocks_s", "usage_s", "record_s"))
    assert parts > 0 and figures["record_s"] > 0 and figures["usage_s"] > 0 and abs(figures["cpu_s"] - parts) < 1e-9


def test_the_head_telemetry_bench_scrapes_the_metrics_page_when_asked():
    from bench.scenarios.telemetry_head import Traffic, head_minute

    figures = head_minute(Traffic(40, 8, 20.0, 120.0, seed=3), 1, scrape_every=15.0)
    parts = sum(figures[k] for k in ("decode_s", "read_s", "score_s", "clocks_s", "usage_s", "record_s", "metrics_s"))
    assert figures["metrics_s"] > 0 and figures["scrape_s"] > 0 and abs(figures["cpu_s"] - parts) < 1e-9
    assert 40 < figures["scrape_kb"] < 200, figures  # 40 nodes x 8 ranks: ~1,000 series
