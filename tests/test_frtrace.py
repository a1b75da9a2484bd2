"""The ranks' Flight Recorder dumps as torch's own analyser reads them (issue 40 §4, xrun.launch.telemetry.frtrace):
the repair of torch 2.13's default-group config, the folder's files and modes, and ``torchfrtrace`` itself reading
what a real hang left (the end-to-end tests: tests/test_telemetry_head.py, tests/cluster/test_hang_doctor.py)."""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys

import pytest

from xrun.launch.telemetry.frtrace import analyser_dump, write_analyser_folder


def entry(seq: int, record_id: int, *, retired: bool) -> dict:
    """One entry as torch 2.13 records a gloo all_reduce (taken from a real dump on this machine)."""
    return {"collective_seq_id": seq, "input_dtypes": ["Float"], "input_sizes": [[4096]], "is_p2p": False,
            "op_id": seq, "output_dtypes": ["Float"], "output_sizes": [[4096]], "p2p_seq_id": 0, "pg_id": 0,
            "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce", "record_id": record_id,
            "retired": retired, "state": "scheduled", "thread_id": "140410575772544", "thread_name": "python",
            "time_created_ns": 1796543544059975245 + seq, "time_discovered_completed_ns": 0,
            "time_discovered_started_ns": 0, "timeout_ms": 1800000}


def dump(*entries: dict) -> dict:
    """What torch 2.13's _dump_fr_trace_json answers for a gloo job's default group (its config under "")."""
    return {"comm_lib_version": "", "nccl_comm_state": {}, "version": "2.10",
            "pg_config": {"": {"desc": "", "name": "", "ranks": "[0, 1, 2]"}},
            "pg_status": {"0": {"last_completed_collective": "1", "last_enqueued_collective": str(len(entries)),
                                "last_started_collective": "-1"}},
            "entries": list(entries)}


ENTERED = dump(entry(1, 0, retired=True), entry(2, 1, retired=False))  # waits in all_reduce #2
LAGGING = dump(entry(1, 0, retired=True))  # never entered it
TORCH_2_13 = ENTERED


def test_the_default_groups_config_is_keyed_as_its_entries_name_it():
    fixed = analyser_dump(TORCH_2_13)
    assert fixed["pg_config"] == {"0": {"desc": "default_pg", "name": "0", "ranks": "[0, 1, 2]"}}
    assert {k: v for k, v in fixed.items() if k != "pg_config"} == {k: v for k, v in TORCH_2_13.items()
                                                                   if k != "pg_config"}
    assert TORCH_2_13["pg_config"] == {"": {"desc": "", "name": "", "ranks": "[0, 1, 2]"}}  # the input is untouched


def test_a_config_already_keyed_as_its_entries_and_the_other_groups_stay():
    sub = {**entry(1, 2, retired=True), "process_group": ["1", "tp"]}
    keyed = {**ENTERED, "entries": [*ENTERED["entries"], sub],
             "pg_config": {"0": {"desc": "default_pg", "name": "0", "ranks": "[0, 1]"},
                           "1": {"desc": "tp", "name": "1", "ranks": "[0]"}}}
    assert analyser_dump(keyed) == keyed
    # a group recorded under another key with its description is moved to the name its entries use
    moved = analyser_dump({**keyed, "pg_config": {"0": keyed["pg_config"]["0"], "x": {"desc": "tp", "ranks": "[0]"}}})
    assert moved["pg_config"]["1"] == {"desc": "tp", "name": "1", "ranks": "[0]"} and "x" not in moved["pg_config"]


@pytest.mark.parametrize("odd", [{}, {"entries": None, "pg_config": None}, {"entries": [{"process_group": 5}]},
                                 {"entries": ["x", {"process_group": ["0"]}], "pg_config": {"": "not a map"}}])
def test_a_dump_of_another_shape_passes_without_an_error(odd):
    assert set(analyser_dump(odd)) == set(odd) | {"pg_config"}


def test_the_folder_beside_the_records_has_one_private_pickle_per_rank_with_a_dump(tmp_path):
    records = tmp_path / "xrun-collectives-20261206-000000-abc.json"
    records.write_text("{}")
    full = {0: {"flight_recorder": TORCH_2_13}, 2: {"flight_recorder": TORCH_2_13}, 1: {"flight_recorder": None}}
    folder = write_analyser_folder(str(records), full)
    assert folder == str(tmp_path / "xrun-collectives-20261206-000000-abc")
    assert sorted(os.listdir(folder)) == ["rank_0", "rank_2"]
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(os.path.join(folder, f)).st_mode) == 0o600 for f in os.listdir(folder))
    with open(os.path.join(folder, "rank_2"), "rb") as f:
        assert pickle.load(f) == analyser_dump(TORCH_2_13)  # noqa: S301 - the test's own file
    assert write_analyser_folder(str(records), {0: {"flight_recorder": None}}) is None  # no dump: no folder


def test_a_folder_somebody_made_first_is_never_written_into(tmp_path):
    records = tmp_path / "xrun-collectives-x.json"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "xrun-collectives-x").symlink_to(elsewhere)
    with pytest.raises(FileExistsError):
        write_analyser_folder(str(records), {0: {"flight_recorder": TORCH_2_13}})
    assert not os.listdir(elsewhere)


def torchfrtrace(folder: str) -> str:
    """What torch's analyser says of ``folder`` (``torchfrtrace``'s module, with this interpreter; it writes its
    findings on stderr)."""
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


@pytest.mark.torch
def test_torchs_analyser_reads_the_folder_and_fails_on_torchs_own_keys(tmp_path):
    """The repair is what lets it read a gloo job's dumps: with torch's keys as they are it stops at a KeyError."""
    full = {0: {"flight_recorder": ENTERED}, 1: {"flight_recorder": LAGGING}, 2: {"flight_recorder": ENTERED}}
    folder = write_analyser_folder(str(tmp_path / "records.json"), full)
    assert folder is not None
    out = torchfrtrace(folder)
    assert "missing ranks: {1}" in out and "collective: gloo:all_reduce" in out, out
    raw = tmp_path / "raw"
    raw.mkdir()
    for rank, answers in full.items():
        (raw / f"rank_{rank}").write_bytes(pickle.dumps(answers["flight_recorder"]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(raw)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "KeyError" in done.stderr  # torch 2.13's own form (issue 40 §4)
