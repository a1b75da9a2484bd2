"""The job's record (issue 40 §1, xrun.runner.job.record): ``events.jsonl``'s format and bound, the goodput folded
over its events, and the record of a real head with real agents (the cluster's: tests/cluster/test_restarts.py)."""

from __future__ import annotations

import json
import os
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import run_xrun
from tests.test_restarts import FLAKY, run_flaky_logged_job, run_logged_job
from xrun.runner.job.record.file import EventsFile
from xrun.runner.job.record.goodput import PHASES, Goodput, goodput_of


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the file: format and bound ----------------------------------------------------------------------------------


def test_a_line_is_compact_json_with_t_and_event_first(tmp_path):
    record = EventsFile(str(tmp_path / "logs" / "events.jsonl"))  # its folder is made by the thread
    record.write({"t": 1.5, "event": "node_joined", "host": "a'; echo \n", "node": 0})
    assert record.close()
    text = (tmp_path / "logs" / "events.jsonl").read_text()
    assert text == '{"t":1.5,"event":"node_joined","host":"a\'; echo \\n","node":0}\n'
    assert list(json.loads(text)) == ["t", "event", "host", "node"]


def test_a_rerun_into_the_same_folder_sets_the_earlier_record_aside(tmp_path):
    for run in (1, 2):
        record = EventsFile(str(tmp_path / "events.jsonl"))
        record.write({"t": 0, "event": "job_started", "run": run})
        assert record.close() and record.error is None
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and files[1] == "events.jsonl" and files[0].startswith("events.2"), files
    assert [read(tmp_path / name)[0]["run"] for name in files] == [1, 2]


def test_a_link_in_the_records_place_is_not_written_through(tmp_path):
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "events.jsonl").symlink_to(tmp_path / "elsewhere")
    record = EventsFile(str(tmp_path / "events.jsonl"))
    record.write({"t": 0, "event": "job_started"})
    assert record.close()
    assert "symbolic link" in record.error and (tmp_path / "elsewhere").read_text() == ""


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.booleans()), max_size=60))
def test_the_file_never_passes_its_cap_and_samples_go_first(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("record") / "events.jsonl"
    record = EventsFile(str(path), max_bytes=4000, samples_up_to=2000)
    accepted = []
    for t, (size, sample) in enumerate(lines):
        fields = {"t": t, "event": "sample" if sample else "x", "pad": "p" * size}
        if record.write(fields, sample=sample):
            accepted.append(fields)
    assert record.close()
    got = read(path)
    assert path.stat().st_size == record.size <= 4000
    assert [g for g in got if g["event"] not in ("samples_stopped", "capped")] == accepted
    assert record.dropped() == len(lines) - len(accepted)
    if record.samples_stopped:  # said once, where it happened, and no sample after it
        stop = [g["event"] for g in got].index("samples_stopped")
        assert all(g["event"] != "sample" for g in got[stop:])
    assert [g["event"] for g in got].count("capped") == int(record.capped)
    assert not record.capped or got[-1]["event"] == "capped"


class IntoAFifo(EventsFile):
    """Written into a FIFO: its open blocks until a reader comes, as a disk that does not answer."""

    def _open(self):
        return open(self.path, "wb", buffering=0)


def test_a_stalled_disk_never_holds_the_writer_and_the_gap_is_said(tmp_path):
    """The thread blocks opening a FIFO nobody reads (a disk that does not answer): writes and flushes return at
    once, pieces past the backlog are dropped and counted, and once the disk answers the file says where."""
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    record = IntoAFifo(str(fifo), backlog_bytes=100)
    for t in range(10):
        record.write({"t": t, "event": "x", "pad": "p" * 30})
        record.flush()  # one piece a line: the first fits the backlog, the rest are dropped
    assert record.dropped() == 9
    got = []
    reader = threading.Thread(target=lambda: got.extend(open(fifo).read().splitlines()))
    reader.start()
    record.write({"t": 10, "event": "y"})
    assert record.close(wait=10)
    reader.join(10)
    assert [json.loads(line)["event"] for line in got] == ["x", "dropped", "y"]
    assert json.loads(got[1]) == {"event": "dropped", "lines": 9}


# -- the goodput --------------------------------------------------------------------------------------------------


def test_goodput_splits_a_restarted_hung_job_by_phase():
    events = [
        {"t": 0, "event": "job_started"},
        {"t": 5, "event": "attempt_started", "attempt": 0},
        {"t": 65, "event": "failure"},  # trained 60 s
        {"t": 66, "event": "stop_requested", "by": "failure"},
        {"t": 70, "event": "attempt_ended"},
        {"t": 72, "event": "attempt_started", "attempt": 1},  # 7 s restarting
        {"t": 172, "event": "hang_detected", "silent_s": 30},  # 70 s trained, then 30 s silent
        {"t": 172, "event": "failure"},
        {"t": 180, "event": "job_ended"},  # 8 s of teardown
    ]
    assert goodput_of(events) == {"wall_s": 180, "training_s": 130, "share": 0.7222,
                                  "lost_s": {"startup": 5, "hang": 30, "restarts": 7, "teardown": 8}}


def test_goodput_of_a_job_still_running_counts_up_to_now():
    fold = Goodput()
    for event in ({"t": 0, "event": "job_started"}, {"t": 10, "event": "attempt_started"}):
        fold.add(event)
    assert fold.to_json(now=40) == {"wall_s": 40, "training_s": 30, "share": 0.75,
                                    "lost_s": {"startup": 10, "hang": 0, "restarts": 0, "teardown": 0}}
    assert goodput_of([{"t": 0, "event": "job_started"}, {"t": 3, "event": "failure"},
                       {"t": 4, "event": "job_ended"}])["lost_s"]["startup"] == 4  # no rank ever started


KINDS = ["attempt_started", "failure", "rank_exited", "hang_detected", "stop_requested", "attempt_ended",
         "node_joined", "dropped"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.floats(0, 100), st.floats(0, 50), st.booleans())))
def test_the_phases_add_up_to_the_wall_time_and_none_is_negative(steps):
    events, t = [{"t": 0.0, "event": "job_started"}], 0.0
    for kind, gap, silent, by_signal in steps:
        t += gap
        events.append({"t": t, "event": kind, "silent_s": silent, "by": "signal" if by_signal else "failure"})
    events.append({"t": t + 1, "event": "job_ended"})
    got = goodput_of(events)
    parts = [got["training_s"], *got["lost_s"].values()]
    assert sorted(got["lost_s"]) == sorted(p for p in PHASES if p != "training")
    assert min(parts) >= 0
    assert abs(sum(parts) - got["wall_s"]) < 1e-6 * max(1.0, got["wall_s"]) + 0.005
    assert got["wall_s"] == round(t + 1, 3)


# -- a real head with real agents (no ssh) -----------------------------------------------------------------------


def test_a_head_with_a_restart_records_it_in_order_and_sums_it_up(tmp_path):
    logs = run_flaky_logged_job(tmp_path)
    events = read(logs / "events.jsonl")
    kinds = [e["event"] for e in events]
    # rank 0's exit may come after rank 1's failure and the stop it begins: the ranks' exits are checked apart
    assert [k for k in kinds if k != "rank_exited"] == [
        "job_started", "node_joined", "node_ready", "attempt_started", "node_started", "failure", "stop_requested",
        "attempt_ended", "node_ready", "attempt_started", "node_started", "attempt_ended", "job_ended"], kinds
    assert sorted((e["attempt"], e["rank"]) for e in events if e["event"] == "rank_exited") == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    assert kinds.index("rank_exited") > kinds.index("node_started")
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    failed = next(e for e in events if e["event"] == "rank_exited" and e["code"])
    assert (failed["rank"], failed["code"], failed["host"], failed["attempt"]) == (1, 3, "a", 0)
    assert failed["cpu_s"] > 0 and failed["peak_rss_bytes"] > 0
    assert [(e["attempt"], e["ending"], e["exit_code"]) for e in events if e["event"] == "attempt_ended"] == [
        (0, "restart", 3), (1, "final", None)]
    stop = events[kinds.index("stop_requested")]
    assert (stop["by"], stop["signal"], stop["reason"]) == ("failure", "SIGTERM", failed_reason(events))
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["goodput"] == events[-1]["goodput"] == goodput_of(events)
    assert summary["events"] == {"file": "events.jsonl", "bytes": (logs / "events.jsonl").stat().st_size,
                                 "dropped": 0}
    goodput = summary["goodput"]
    assert goodput["wall_s"] == events[-1]["t"] and 0 < goodput["share"] < 1
    assert goodput["lost_s"]["startup"] == events[kinds.index("attempt_started")]["t"]


def test_a_local_run_is_recorded_by_its_head_as_a_one_node_job(tmp_path):
    """``xrun script`` (no hostfile) is a one-node job (xrun.joined.one_node): its head writes the same
    record, restart included, and its summary the same goodput."""
    logs = tmp_path / "logs"
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    done = run_xrun("--nproc_per_node", "2", "--max_restarts", "1", "--log_dir", str(logs), str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = read(logs / "events.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds[0] == "job_started" and events[0]["nodes"] == 1 and kinds[-1] == "job_ended", kinds
    assert [(e["attempt"], e["ending"]) for e in events if e["event"] == "attempt_ended"] == [
        (0, "restart"), (1, "final")]
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["goodput"] == events[-1]["goodput"] == goodput_of(events)
    assert [a["attempt"] for a in summary["attempts"]] == [0, 1]


def failed_reason(events):
    return next(e["reason"] for e in events if e["event"] == "failure")



BUSY_AND_BIG = """
import os, time
end = time.monotonic() + 3.0
if os.environ["RANK"] == "0":
    while time.monotonic() < end:  # busy
        pass
else:
    big = bytearray(200 << 20)
    big[::4096] = b"x" * (50 << 10)  # touched: resident
    time.sleep(end - time.monotonic())
"""


def test_a_busy_rank_and_a_big_rank_show_in_the_samples(tmp_path, monkeypatch):
    """Each rank's CPU and RSS reach the head's samples from the agents' readings (issue 40 §1), at the test's
    sample period (XRUN_SAMPLE_EVERY_S: the head and its agents read it alike)."""
    monkeypatch.setenv("XRUN_SAMPLE_EVERY_S", "0.5")
    logs = run_logged_job(tmp_path, BUSY_AND_BIG, {"a": (0,), "b": (0,)})
    events = read(logs / "events.jsonl")
    assert events[0]["sample_every_s"] == 0.5
    assert events[0]["usage_every"] == 1  # every sample has them
    samples = [e for e in events if e["event"] == "sample" and e["cpu_pct"]]
    assert len(samples) >= 2, [e for e in events if e["event"] == "sample"]
    for sample in samples:
        assert len(sample["cpu_pct"]) == len(sample["rss_mib"]) <= 2
    full = [s for s in samples if len(s["cpu_pct"]) == 2 and None not in s["cpu_pct"]]
    assert full, samples
    # a shared machine may give the busy loop less than a core, never as little as the sleeper's (whose first
    # reading holds its start and its allocation: some CPU)
    assert max(s["cpu_pct"][0] for s in full) >= 30 and min(s["cpu_pct"][1] for s in full) <= 10, full
    assert all(s["cpu_pct"][0] > s["cpu_pct"][1] for s in full), full
    assert max(s["rss_mib"][1] for s in full) >= 190 and all(s["rss_mib"][0] < 100 for s in full), full
