"""report.html (issue 40 §2): the page's content from synthetic records (lanes, marks, bounds, hostile strings),
``xrun report DIR``'s errors, and in a real browser the page of a hostile record and of a job whose head was
killed (the restart's page: tests/test_restarts.py; the straggler's: tests/test_telemetry_head.py; the spare
swap's: tests/cluster/test_spares.py).
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.conftest import run_xrun
from tests.report_browser import open_report
from tests.test_pod_run import Pod
from xrun.runner.report.command import main as report_main
from xrun.runner.report.command import report
from xrun.runner.report.model import LINES_UP_TO, POINTS, RANK_LANES_UP_TO, Outcome, report_of
from xrun.runner.report.page import render

HOSTILE = "</script><img src=x onerror=alert(1)>"


def record(*, hosts=("a", "b"), ranks=2, samples=0, cause="rank 1 (local 1) on a exited with code 3"):
    """A job of len(hosts) nodes × ``ranks``: attempt 0 fails (rank 1), attempt 1 runs on a spare in node 1's place,
    rank 2 is named a straggler, ``samples`` sample lines with lateness, CPU and RSS."""
    world = len(hosts) * ranks
    lines = [{"t": 0.0, "event": "job_started", "unix_ns": 1_796_554_073_869_735_566, "xrun": "0.1.0",
              "nodes": len(hosts), "world_size": world, "hosts": [*hosts, "spare"], "spares": 1, "max_restarts": 1,
              "hang_timeout": None, "sample_every_s": 60.0, "usage_every": 1, "run_id": "xrun-test",
              "command": ["python", "-u", "train.py", HOSTILE], "env": {"RANK": "0", "WORLD_SIZE": str(world)},
              "local_ranks": [ranks] * len(hosts)}]
    lines += [{"t": 0.1, "event": "node_joined", "node": n, "host": h, "addr": "x"} for n, h in enumerate(hosts)]
    for attempt, t0 in ((0, 1.0), (1, 10.0)):
        lines.append({"t": t0, "event": "attempt_started", "attempt": attempt, "nodes": len(hosts)})
        lines += [{"t": t0 + 0.1, "event": "node_started", "attempt": attempt, "node": n,
                   "host": "spare" if attempt and n == 1 else h} for n, h in enumerate(hosts)]
        if attempt == 0:
            lines.append({"t": 2.0, "event": "straggler_named", "attempt": 0, "rank": 2, "host": hosts[2 // ranks],
                          "late_ms": 180.0})
            for i in range(samples):
                lines.append({"t": 2.0 + i * 6 / max(samples, 1), "event": "sample", "attempt": 0,
                              "late_ms": {"2": 180.0 + i}, "cpu_pct": [100 + r for r in range(world)],
                              "rss_mib": [500 + r for r in range(world)]})
            lines.append({"t": 8.0, "event": "rank_exited", "attempt": 0, "node": 0, "host": hosts[0], "rank": 1,
                          "local_rank": 1, "code": 3, "signal": None, "stopped": False})
            lines.append({"t": 8.0, "event": "failure", "attempt": 0, "reason": cause, "host": hosts[0], "rank": 1,
                          "exit_code": 3})
            lines += [{"t": 8.5, "event": "rank_exited", "attempt": 0, "node": r // ranks, "host": hosts[r // ranks],
                       "rank": r, "local_rank": r % ranks, "code": None, "signal": "SIGTERM", "stopped": True}
                      for r in range(world) if r != 1]
            lines.append({"t": 9.0, "event": "attempt_ended", "attempt": 0, "began_at_s": 0.0, "ran_s": 7.0,
                          "ended_at_s": 9.0, "root_cause": cause, "replaced": [], "ending": "restart"})
            lines.append({"t": 9.5, "event": "spare_swapped", "attempt": 1, "node": 1, "lost_host": hosts[1],
                          "spare_host": "spare"})
        else:
            lines += [{"t": 15.0, "event": "rank_exited", "attempt": 1, "node": r // ranks, "host": hosts[r // ranks],
                       "rank": r, "local_rank": r % ranks, "code": 0, "signal": None, "stopped": False}
                      for r in range(world)]
            lines.append({"t": 15.5, "event": "attempt_ended", "attempt": 1, "began_at_s": 9.0, "ran_s": 5.0,
                          "ended_at_s": 15.5, "root_cause": None, "replaced": [], "ending": "final"})
    lines.append({"t": 16.0, "event": "job_ended", "exit_code": 0, "root_cause": None, "interrupted_by": None,
                  "attempts": 2, "goodput": {"wall_s": 16.0, "training_s": 12.0, "share": 0.75, "lost_s": {}}})
    return lines


def write_record(log_dir, lines, *, tail=""):
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + tail)
    return log_dir


def test_a_lane_for_the_job_each_node_and_each_rank_with_the_restart_the_swap_and_the_straggler_marked():
    page = report_of(record())
    assert page.lanes == ("job", "node 0 (a)", "rank 0 (a)", "rank 1 (a)", "node 1 (b → spare)", "rank 2 (b)",
                          "rank 3 (b)")
    marks = {(m.kind, m.lane): m.text for m in page.marks}
    assert marks[("restart", "job")] == "restart after attempt 0: rank 1 (local 1) on a exited with code 3"
    assert marks[("failure", "rank 1 (a)")].endswith("rank 1 (local 1) on a exited with code 3")
    assert marks[("spare swap", "node 1 (b → spare)")] == "spare spare takes node 1's place from b (attempt 1 on)"
    assert marks[("straggler", "rank 2 (b)")] == "straggler: rank 2 (b) +180.0 ms"
    spans = [(s.lane, s.outcome, s.start, s.end) for s in page.spans if s.lane == "rank 1 (a)"]
    assert spans == [("rank 1 (a)", Outcome.FAILED, 1.1, 8.0), ("rank 1 (a)", Outcome.OK, 10.1, 15.0)]
    assert [row[4] for row in page.attempts] == ["restart", "final"]
    assert page.root_cause[0] == "The job succeeded: every rank exited with code 0."
    assert "Attempt 0 was restarted after: rank 1 (local 1) on a exited with code 3." in page.root_cause
    assert page.command == ("python", "-u", "train.py", HOSTILE) and ("WORLD_SIZE", "4") in page.env


def test_the_charts_carry_lateness_cpu_and_memory_by_rank_and_their_values_are_in_the_text():
    page = report_of(record(samples=5))
    late, cpu, rss = page.charts
    assert [s.name for s in late.series] == ["rank 2"] and late.series[0].values == (180.0, 181.0, 182.0, 183.0, 184.0)
    assert [s.name for s in cpu.series] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert rss.series[3].values == (503.0,) * 5
    html = render(page, "")
    assert "<th>rank 2 (ms)</th>" in html and "<td>184</td>" in html and "<td>503</td>" in html


def test_a_big_job_is_bounded_lanes_for_the_marked_ranks_lines_for_the_spread_and_thinned_samples():
    hosts = tuple(f"n{i}" for i in range(40))
    page = report_of(record(hosts=hosts, ranks=8, samples=POINTS * 3))
    assert 320 > RANK_LANES_UP_TO
    assert [lane for lane in page.lanes if lane.startswith("rank")] == ["rank 1 (n0)", "rank 2 (n0)"]
    assert len([s for s in page.spans if s.lane.startswith("rank ")]) == 2 * 320  # the table keeps every span
    for chart in page.charts:
        assert len(chart.t) <= POINTS + 1 and len(chart.series) <= LINES_UP_TO
    assert [s.name for s in page.charts[1].series] == ["max over ranks", "median over ranks", "min over ranks"]
    assert "every 3th of 1200 samples drawn" in page.charts[1].note and any("320 ranks" in n for n in page.notes)


def test_hostile_strings_from_the_record_stay_text():
    lines = record(hosts=(HOSTILE, "b"), cause=f"rank 1 on {HOSTILE} exited")
    page = render(report_of(lines, failure={"headline": HOSTILE}), "/* plotly.js */")
    assert HOSTILE not in page and "onerror=alert(1)>" not in page.replace("&gt;", "")
    assert page.count("<script") == 3  # the figures' JSON, plotly.js, the glue: no other
    figures = page.split('<script type="application/json" id="xrun-figures">')[1].split("</script>")[0]
    assert "<" not in figures and json.loads(figures)["timeline"]["layout"]["yaxis"]["categoryarray"][1] == (
        "node 0 (&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;)")  # plotly shows the entity as the character
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page


@pytest.mark.parametrize("case, expected", [
    ("missing dir", "{d}/nope: no such directory (give the --log_dir of a run)"),
    ("no events", "{d}/events.jsonl: no such file: the head writes it with --log_dir (docs/events.md)"),
    ("torn middle", "{d}/events.jsonl:2: not a line of the record (one JSON object with an 'event')"),
    ("not a record", "{d}/events.jsonl:1: the record does not begin with job_started"),
    ("bad summary", "{d}/summary.json: not JSON (Expecting value: line 1 column 1 (char 0))"),
])
def test_bad_input_is_one_line_naming_the_file_and_exit_2(tmp_path, capsys, case, expected):
    d = tmp_path / "logs"
    d.mkdir()
    lines = [json.dumps(line) for line in record()]
    if case == "torn middle":
        (d / "events.jsonl").write_text("\n".join([lines[0], lines[1][:20], *lines[2:]]) + "\n")
    elif case == "not a record":
        (d / "events.jsonl").write_text(lines[1] + "\n")
    elif case == "bad summary":
        (d / "events.jsonl").write_text("\n".join(lines) + "\n")
        (d / "summary.json").write_text("")
    target = d / "nope" if case == "missing dir" else d
    assert report_main([str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"xrun: {expected.format(d=d)}\n"


def test_the_cli_says_its_usage_in_one_line_and_exit_2():
    done = run_xrun("report")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "usage: xrun report DIR" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_torn_last_line_is_left_out_and_said(tmp_path):
    logs = write_record(tmp_path / "logs", record()[:-3], tail='{"t": 15.1, "event": "attem')
    page = (tmp_path / "logs" / "report.html")
    assert report(str(logs)) == str(page)
    text = page.read_text()
    assert "The record&#x27;s last line was cut" in text and "no end in the record: the run is still going" in text


@pytest.mark.slow
def test_the_hostile_page_in_a_browser_shows_the_host_as_text_and_runs_nothing_else(tmp_path):
    logs = write_record(tmp_path / "logs", record(hosts=(HOSTILE, "b"), samples=3))
    drawn = open_report(tmp_path / report(str(logs)), tmp_path, "hostile")  # a dialog (alert) would hang: none
    assert f"node 0 ({HOSTILE})" in drawn.lanes and f"rank 0 ({HOSTILE})" in drawn.lanes
    assert HOSTILE in drawn.text and len(drawn.lanes) == 7


KILLED_SCRIPT = """
import os, time
open(f"started-{os.environ['RANK']}", "w").close()
time.sleep(60)
"""


@pytest.mark.slow
def test_the_page_of_a_job_whose_head_was_killed(tmp_path):
    """A one-node pod job (node 0 is the head and writes the record) is SIGKILLed while its ranks run; ``xrun
    report`` draws what the record had: both ranks' lanes, running at the last line, and no end."""
    pod = Pod(tmp_path)
    (tmp_path / "hosts").write_text("127.0.0.1 slots=2\n")
    (tmp_path / "train.py").write_text(KILLED_SCRIPT)
    head = pod.start(0, options=("--log_dir", "logs"))
    events = tmp_path / "logs" / "events.jsonl"
    deadline = time.monotonic() + 30
    while not (events.exists() and '"node_started"' in events.read_text()):  # the lines reach the file every 2 s
        assert time.monotonic() < deadline and head.poll() is None, "the record has no node_started"
        time.sleep(0.1)
    head.kill()
    assert pod.finish()[0][0] == -signal.SIGKILL  # and no rank is left (its watchdog stops it)
    done = run_xrun("report", str(tmp_path / "logs"))
    assert done.returncode == 0, done.stderr
    drawn = open_report(tmp_path / "logs" / "report.html", tmp_path, "killed")
    assert set(drawn.lanes) == {"job", "node 0 (127.0.0.1)", "rank 0 (127.0.0.1)", "rank 1 (127.0.0.1)"}
    assert "no end in the record: the run is still going, or its head died" in drawn.text
    assert "running at the last line" in drawn.svg_text  # the legend of the spans that never ended


def test_a_link_planted_where_the_page_goes_is_replaced_not_written_through(tmp_path):
    logs = write_record(tmp_path / "logs", record())
    target = tmp_path / "elsewhere"
    target.write_text("theirs")
    (logs / "report.html").symlink_to(target)
    report(str(logs))
    assert target.read_text() == "theirs" and not (logs / "report.html").is_symlink()
    assert [p.name for p in logs.iterdir() if p.name.endswith(".tmp")] == []


def groups_record():
    """A local run of 2 replica groups × 2 ranks, group 1's rank 1 (the job's rank 3) ending twice, each time
    restarting its group alone (as the head records it: tests/test_replica_groups.py runs a real one)."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "REPLICA_GROUP_ID": "0", "NUM_REPLICA_GROUPS": "2",
           "TORCHELASTIC_MAX_RESTARTS": "2"}
    lines = [{"t": 0.0, "event": "job_started", "unix_ns": 1_796_588_070_174_682_281, "xrun": "0.1.0", "nodes": 1,
              "world_size": 4, "hosts": ["localhost"], "spares": 0, "max_restarts": 0, "hang_timeout": None,
              "sample_every_s": 60.0, "usage_every": 1, "run_id": "xrun-groups", "command": ["python", "t.py"],
              "env": env, "local_ranks": [4]},
             {"t": 0.1, "event": "attempt_started", "attempt": 0, "nodes": 1},
             {"t": 0.2, "event": "node_started", "attempt": 0, "node": 0, "host": "localhost"}]
    for t, restart, cause, others in ((0.7, 1, "was killed by SIGKILL", [0]), (1.2, 2, "exited with code 3", [])):
        lines.append({"t": t, "event": "group_restarted", "node": 0, "host": "localhost", "group": 1,
                      "restart": restart, "budget": 2, "rank": 3, "cause": cause, "at": 1_796_588_070.9,
                      "others": others})
    lines += [{"t": t, "event": "rank_exited", "attempt": 0, "node": 0, "host": "localhost", "rank": r,
               "local_rank": r, "code": 0, "signal": None, "stopped": False}
              for r, t in ((0, 1.1), (1, 1.1), (2, 2.3), (3, 2.3))]
    lines.append({"t": 2.4, "event": "attempt_ended", "attempt": 0, "began_at_s": 0.0, "ran_s": 2.2,
                  "ended_at_s": 2.4, "root_cause": None, "replaced": [], "ending": "final"})
    lines.append({"t": 2.4, "event": "job_ended", "exit_code": 0, "root_cause": None, "interrupted_by": None,
                  "attempts": 1})
    return lines


def test_a_replica_groups_restarts_are_marked_their_runs_cut_and_tabled():
    """--replica_groups: each group restart is a mark on the lane of the rank whose end caused it, ends the group's
    ranks' runs there (that rank's failed, the other's stopped by xrun), and is a row of its own table; the facts
    and the root cause count them. A run without groups has none of it."""
    page = report_of(groups_record())
    assert [(m.lane, m.t, m.kind, m.text) for m in page.marks] == [
        ("rank 3 (localhost)", 0.7, "group restart", "replica group 1 restarted (restart 1 of 2) on localhost: rank 3 "
                                                     "was killed by SIGKILL; group 0 ran on"),
        ("rank 3 (localhost)", 1.2, "group restart", "replica group 1 restarted (restart 2 of 2) on localhost: rank 3 "
                                                     "exited with code 3; no other group ran on its node")]
    runs = {lane: [(s.start, s.end, s.outcome) for s in page.spans if s.lane == lane]
            for lane in ("rank 1 (localhost)", "rank 2 (localhost)", "rank 3 (localhost)")}
    assert runs == {"rank 1 (localhost)": [(0.2, 1.1, Outcome.OK)],  # group 0: one run
                    "rank 2 (localhost)": [(0.2, 0.7, Outcome.STOPPED), (0.7, 1.2, Outcome.STOPPED),
                                           (1.2, 2.3, Outcome.OK)],
                    "rank 3 (localhost)": [(0.2, 0.7, Outcome.FAILED), (0.7, 1.2, Outcome.FAILED),
                                           (1.2, 2.3, Outcome.OK)]}
    assert page.group_restarts == (("0.7", "1", "1 of 2", "localhost", "3", "was killed by SIGKILL", "0"),
                                   ("1.2", "1", "2 of 2", "localhost", "3", "exited with code 3", "none"))
    assert page.facts[-2:] == (("replica groups", "2, each restarted alone up to 2 time(s) (--max_restarts)"),
                               ("replica group restarts", "replica group 1 restarted twice"))
    assert "Replica group 1 restarted twice (--replica_groups: each restart under the timeline)." in page.root_cause
    html = render(page, "")
    assert ('<table id="group-restarts"><thead><tr><th>t (s)</th><th>group</th><th>restart</th><th>host</th>'
            '<th>rank</th><th>its end</th><th>groups that ran on</th></tr></thead><tbody><tr><td>0.7</td><td>1</td>'
            '<td>1 of 2</td><td>localhost</td><td>3</td><td>was killed by SIGKILL</td><td>0</td></tr>') in html
    plain = render(report_of(record()), "")
    assert "Replica group" not in plain and "replica group" not in plain and "group restart" not in plain
