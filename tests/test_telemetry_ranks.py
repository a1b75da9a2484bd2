"""Telemetry inside real ranks (issue 31): a rank cannot tell it is instrumented, a script without torch pays
nothing, the endpoint is a Unix socket in a 0700 directory, and a hang's collective records come back.

Every case runs the same probe twice through the real xrun entry point, with telemetry (the default) and with
``--no_telemetry``, and compares what the script saw: ``sys.argv``, ``__main__``, ``sys.path``, the
environment, the ``sitecustomize`` that ran, and the same from a multiprocessing spawn child and DataLoader
workers. The one difference allowed is torch's own ``TORCH_FR_BUFFER_SIZE`` (torch reads it when it makes a
process group, after the script started).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time

import pytest

from tests.conftest import ROOT, run_xrun
from tests.headserver import endpoint_of, head_server
from tests.test_control import LocalSessions
from xrun.channel import Kind
from xrun.common.output.status import PlainStatus
from xrun.common.rankplan import LaunchOptions
from xrun.common.spec import AgentOptions
from xrun.common.telemetry.records import read_collectives, read_entry_times
from xrun.launch.telemetry.client import ENDPOINT_GONE
from xrun.runner.job.control_server import ControlServer
from xrun.runner.plan import JobRequest, make_plan

OBSERVE = r'''
import json, os, re, sys

def observe(where):
    import __main__
    spec = getattr(__main__, "__spec__", None)
    seen = {
        "where": where, "argv": sys.argv, "orig_argv": [re.sub(r"=\d+", "=N", a) for a in sys.orig_argv[1:]],  # a spawn child's fd numbers
        "main_file": getattr(__main__, "__file__", None), "main_spec": getattr(spec, "name", None),
        "path": sys.path, "pythonpath": os.environ.get("PYTHONPATH"),
        "env": sorted(k for k in os.environ if k not in ("TORCH_FR_BUFFER_SIZE",)),
        "fr_buffer": os.environ.get("TORCH_FR_BUFFER_SIZE"),
        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
        "user_site_ran": os.environ.get("USER_SITE_RAN"),
        "torch_loaded": "torch" in sys.modules,
        "sockets": sorted(os.listdir(d) for d in _socket_dirs()),
    }
    print("PROBE " + json.dumps(seen), flush=True)

def _socket_dirs():
    tmp = os.environ.get("TMPDIR", "/tmp")
    return [os.path.join(tmp, n) for n in os.listdir(tmp) if n.startswith("xrun-telemetry-")]
'''

PLAIN = OBSERVE + r'''
import multiprocessing

def child():
    observe("spawn child")

if __name__ == "__main__":
    observe("main")
    process = multiprocessing.get_context("spawn").Process(target=child)
    process.start()
    process.join()
'''

WITH_TORCH = OBSERVE + r'''
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

class Probe(Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        observe("dataloader worker")
        return torch.zeros(1)

if __name__ == "__main__":
    dist.init_process_group("gloo")
    t = torch.ones(8)
    dist.all_reduce(t)
    observe("main")
    for context in ("fork", "spawn"):
        for _ in DataLoader(Probe(), num_workers=1, multiprocessing_context=context):
            pass
    dist.barrier()
'''


def probes(result) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line.split("PROBE ", 1)[1]) for line in result.stdout.splitlines() if "PROBE " in line]


def short_tmpdir() -> str:
    """A TMPDIR short enough for a socket's path (pytest's would send the sockets to /tmp)."""
    path = tempfile.mkdtemp(prefix="xt", dir="/tmp")
    atexit.register(shutil.rmtree, path, True)
    return path


def run_both(tmp_path, *args, env=None, cwd=None):
    """The probes' observations with telemetry and without, each run's socket directory root its own."""
    seen = {}
    for flag in ((), ("--no_telemetry",)):
        tmp = short_tmpdir()
        result = run_xrun(*flag, "--master_port", "0", *args, env={"TMPDIR": str(tmp), **(env or {})},
                          cwd=cwd or ROOT, timeout=180)
        seen[bool(flag)] = sorted(probes(result), key=lambda p: (p["where"], p["argv"]))
        assert "WorkerServer" not in result.stderr + result.stdout  # torch's server's noise never shows
        assert os.listdir(tmp) == []  # the socket directory is gone with the run
    return seen[False], seen[True]


def same_but_the_buffer(on: list[dict], off: list[dict]) -> None:
    assert [p["where"] for p in on] == [p["where"] for p in off] and on
    for a, b in zip(on, off):
        assert a["fr_buffer"] == "1000", a  # torch's variable, inherited by what the rank starts
        assert b["fr_buffer"] is None
        assert {k: v for k, v in a.items() if k not in ("fr_buffer", "sockets")} == \
               {k: v for k, v in b.items() if k not in ("fr_buffer", "sockets")}
        assert b["sockets"] == []


def test_a_script_without_torch_sees_what_it_sees_without_telemetry(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PLAIN)
    on, off = run_both(tmp_path, "--num_gpus", "1", str(script), "--flag", "x y")
    same_but_the_buffer(on, off)
    main = next(p for p in on if p["where"] == "main")
    assert main["argv"] == [str(script), "--local_rank=0", "--flag", "x y"] and main["main_file"] == str(script)
    assert main["pythonpath"] == os.environ.get("PYTHONPATH") and not main["torch_loaded"]
    assert main["sockets"] == [[]]  # the directory is there, empty: no torch, no endpoint
    assert main["sitecustomize"] is None


def test_python_dash_m_and_a_users_own_sitecustomize(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PLAIN)
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    env = {"PYTHONPATH": f"{user_site}{os.pathsep}{tmp_path}{os.pathsep}{ROOT}"}
    on, off = run_both(tmp_path, "--num_gpus", "1", "--module", "--no_local_rank", "probe_mod", "a",
                       env=env, cwd=str(tmp_path))
    same_but_the_buffer(on, off)
    for probe in on:
        assert probe["sitecustomize"] == str(user_site / "sitecustomize.py") and probe["user_site_ran"] == "1"
        assert probe["pythonpath"] == env["PYTHONPATH"] and probe["argv"][1:] == ["a"]
    assert next(p for p in on if p["where"] == "main")["main_spec"] == "probe_mod"


def test_a_no_python_program_that_starts_python_is_instrumented_alike(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PLAIN)
    wrapper = tmp_path / "run.sh"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    wrapper.chmod(0o755)
    on, off = run_both(tmp_path, "--num_gpus", "1", "--no_python", "--no_local_rank", str(wrapper), "z")
    same_but_the_buffer(on, off)
    assert next(p for p in on if p["where"] == "main")["argv"] == [str(script), "z"]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("preload", [(), ("--preload=torch",)], ids=["started", "forked"])
def test_a_torch_rank_serves_one_socket_and_its_workers_see_nothing(tmp_path, preload):
    """Ranks forked from --preload torch's helper (issue 32) alike: each serves its socket and sees nothing of it."""
    pytest.importorskip("torch")
    script = tmp_path / "probe.py"
    script.write_text(WITH_TORCH)
    on, off = run_both(tmp_path, "--num_gpus", "2", *preload, str(script))
    same_but_the_buffer(on, off)
    assert [p["where"] for p in on].count("dataloader worker") == 2 * 2 * 2  # 2 ranks, fork and spawn, 2 items
    for probe in on:
        assert probe["torch_loaded"]
        assert probe["sockets"] == [["rank0.sock", "rank1.sock"]]  # one per rank; no worker adds one


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("preload", [(), ("--preload=torch",)], ids=["started", "forked"])
def test_the_socket_directory_is_the_users_alone_and_nothing_listens_on_tcp(tmp_path, preload):
    """Also for a rank forked from --preload torch's helper (issue 32): the rank serves its own socket, and the
    helper (the agent's other child) serves nothing and runs no thread."""
    pytest.importorskip("torch")
    script = tmp_path / "probe.py"
    script.write_text(LISTENING)
    seen = {}
    for flag in ((), ("--no_telemetry",)):
        tmp = short_tmpdir()
        result = run_xrun(*flag, "--num_gpus", "1", "--master_port", "0", *preload, str(script),
                          env={"TMPDIR": str(tmp)}, timeout=180)
        assert result.returncode == 0, result.stderr
        assert ("xrun[localhost]: preloaded torch in " in result.stderr) == bool(preload)
        seen[bool(flag)] = json.loads(result.stdout.split("LISTENING ", 1)[1].splitlines()[0])
    on, off = seen[False], seen[True]
    assert on["tcp"] == off["tcp"]  # torch's store only, alike with and without telemetry
    assert on["mode"] == stat.S_IFDIR | 0o700 and on["owner"] == os.getuid()
    assert on["unix"] == ["rank0.sock"] and off["unix"] is None
    assert on["serving"] == 1 and off["serving"] == 0  # the rank itself listens on rank0.sock
    helper = [{"threads": 1, "unix_listening": 0}] if preload else []
    assert on["helpers"] == helper and off["helpers"] == helper


LISTENING = r'''
import json, os, stat
import torch.distributed as dist
dist.init_process_group("gloo")

def sockets_of(pid):
    mine = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    return mine

def listening_tcp_ports():
    mine = sockets_of("self")
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                count += fields[3] == "0A" and fields[9] in mine  # LISTEN, one of this process's sockets
    return count

def listening_unix(pid, under=None):
    """pid's listening Unix sockets (flags __SO_ACCEPTCON), those bound under ``under`` only when given."""
    mine = sockets_of(pid)
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in list(f)[1:]]
    return sum(int(r[3], 16) & 0x10000 != 0 and r[6] in mine and (under is None or (len(r) > 7 and r[7].startswith(under)))
               for r in rows)

def helpers():
    """The agent's children that run the preload helper (the one the rank was forked from, under --preload)."""
    parent = os.getppid()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                helper = b"xrun.launch.preload.helper" in f.read()
            if ppid == parent and helper:
                found.append({"threads": len(os.listdir(f"/proc/{pid}/task")), "unix_listening": listening_unix(pid)})
        except (OSError, ValueError):
            continue
    return found

tmp = os.environ["TMPDIR"]
dirs = [os.path.join(tmp, n) for n in os.listdir(tmp) if n.startswith("xrun-telemetry-")]
info = os.stat(dirs[0]) if dirs else None
print("LISTENING " + json.dumps({
    "tcp": listening_tcp_ports(), "mode": info.st_mode if info else None, "owner": info.st_uid if info else None,
    "unix": sorted(os.listdir(dirs[0])) if dirs else None, "serving": listening_unix("self", tmp),
    "helpers": helpers()}), flush=True)
dist.destroy_process_group()
'''


SKIPS_ONE = r'''
import os, time
import torch
import torch.distributed as dist

def evaluate():
    time.sleep(120)

print("imported", flush=True)  # the hang watch counts from here (an import under load is a silence too)
dist.init_process_group("gloo")
rank = dist.get_rank()
print("rank", rank, "joined", flush=True)
t = torch.ones(4096)
for _ in range(5):
    dist.all_reduce(t)
print("rank", rank, "trained", flush=True)
if rank == int(os.environ.get("LATE_RANK", "2")):
    evaluate()
dist.all_reduce(t)
'''


def waiting_and_late(ranks: list[dict]) -> tuple[dict, dict]:
    """The ranks' records by what they say: waiting in collective #6, or done with #5 and elsewhere."""
    last = {r["rank"]: r["groups"][0]["recent"][-1] for r in ranks}
    waiting = {rank: c for rank, c in last.items() if c["seq"] == 6}
    late = {rank: c for rank, c in last.items() if c["seq"] == 5}
    return waiting, late


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("preload", [(), ("--preload=torch",)], ids=["started", "forked"])
def test_a_hang_stop_names_the_collective_and_the_rank_that_never_entered_it(tmp_path, preload):
    """3 gloo ranks; rank 2 never enters the 6th all-reduce. --hang_action stop: the records (each rank's last
    collective, where its main thread is) are in the failure report, failure.json and a file on the node; the
    same for ranks forked from --preload torch's helper (issue 32)."""
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(SKIPS_ONE)
    logs = tmp_path / "logs"
    result = run_xrun("--num_gpus", "3", "--master_port", "0", "--hang_timeout", "8", "--hang_action", "stop",
                      *preload, "--log_dir", str(logs), str(script), env={"TMPDIR": short_tmpdir()}, timeout=180)
    assert result.returncode == 124, result.stderr
    assert "WorkerServer" not in result.stderr
    [line] = [x for x in result.stderr.splitlines() if "collective records of" in x and "taken" not in x][-1:]
    assert "collective records of 3 of 3 ranks (torch's Flight Recorder) in " in line
    failure = json.loads((logs / "localhost" / "failure.json").read_text())
    ranks = failure["collectives"]["ranks"]
    waiting, late = waiting_and_late(ranks)
    assert sorted(waiting) == [0, 1] and sorted(late) == [2]
    assert all(c["op"] == "all_reduce" and c["in_sizes"] == [[4096]] and c["in_dtypes"] == ["Float"]
               for c in [*waiting.values(), *late.values()])
    by_rank = {r["rank"]: r for r in ranks}
    assert by_rank[2]["where"] == "job.py:7 evaluate"
    assert by_rank[0]["where"] == "job.py:19 <module>"
    full = json.loads(open(failure["collectives"]["file"]).read())
    assert sorted(full["ranks"]) == ["0", "1", "2"] and full["ranks"]["2"]["flight_recorder"]["entries"]
    assert stat.S_IMODE(os.stat(failure["collectives"]["file"]).st_mode) == 0o600


def run_over_the_channel(tmp_path, script: str, env: dict, *, until) -> None:
    """``script`` on three agents over the control channel (2 + 1 + 1 ranks, all on this machine) until
    ``until()`` (called every 2 s, from a thread) says so, or 120 s passed: then a SIGINT stops the job."""
    path = tmp_path / "job.py"
    path.write_text(script)
    options = dataclasses.replace(AgentOptions(), log_dir=str(tmp_path / "logs"))
    request = JobRequest(script=str(path), master_port=0, launch=LaunchOptions(python=sys.executable),
                         env={"TMPDIR": short_tmpdir(), **env}, cwd=str(tmp_path), options=options)
    # three names of this machine: the ranks' rendezvous needs the master's to resolve
    plan = make_plan(request, {"localhost": (0, 1), "127.0.0.1": (0,), "127.0.0.2": (0,)}, "ssh")
    server = head_server(plan, join_timeout=60, status=PlainStatus(3))
    port = server.listen(["127.0.0.1"])
    sessions = LocalSessions(plan, endpoint_of(server, port))

    def watch():
        deadline = time.monotonic() + 120
        while not until() and time.monotonic() < deadline:
            time.sleep(2)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, daemon=True).start()
    try:
        server.run(sessions)
    finally:
        sessions.terminate()


def spy_on(monkeypatch, kind: Kind, read) -> list:
    """What the head receives of ``kind``, each read with ``read`` (the head's checks: a refusal fails the run)."""
    received = []
    original = ControlServer._agent_message

    def spy(self, node, msg):
        if msg.get("type") == kind.value:
            received.append(read(msg))
        original(self, node, msg)

    monkeypatch.setattr(ControlServer, "_agent_message", spy)
    return received


@pytest.mark.slow
@pytest.mark.torch
def test_the_agents_send_each_ranks_record_to_the_head_over_the_channel(tmp_path, monkeypatch):
    """SIGQUIT's dump brings every node's ``collectives`` message, and it reads back through the head's checks."""
    pytest.importorskip("torch")
    received = spy_on(monkeypatch, Kind.COLLECTIVES, read_collectives)

    def recorded() -> list:
        """The last dump's reports, once all 4 ranks are past the 5 all-reduces."""
        last = max((r.dump_id for r in received if r.dump_id != "stop"), default=None)
        reports = [r for r in received if r.dump_id == last]
        records = [rank for report in reports for rank in report.ranks]
        done = len(records) == 4 and all(r.groups and r.groups[0].recent[-1].seq >= 5 for r in records)
        return reports if done else []

    asked = [time.monotonic()]  # the first after 6 s: the server takes SIGQUIT once it runs

    def until() -> bool:  # SIGQUIT every few seconds (the ranks start slowly under load) until it tells
        if recorded():
            return True
        if time.monotonic() - asked[0] > 6:
            asked[0] = time.monotonic()
            os.kill(os.getpid(), signal.SIGQUIT)
        return False

    run_over_the_channel(tmp_path, SKIPS_ONE, {"LATE_RANK": "3"}, until=until)
    reports = recorded()
    assert sorted(r.rank for report in reports for r in report.ranks) == [0, 1, 2, 3], received
    waiting, late = waiting_and_late([r.to_json() for report in reports for r in report.ranks])
    assert sorted(waiting) == [0, 1, 2] and sorted(late) == [3]
    assert all(report.file and os.path.exists(report.file) for report in reports)


SLOWER_EACH_STEP = r'''
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1024)
for step in range(100000):
    if rank == 3:
        time.sleep(0.05)  # the straggler: every other rank waits for it in each all-reduce
    dist.all_reduce(t)
'''


@pytest.mark.slow
@pytest.mark.torch
def test_the_agents_sample_when_each_rank_entered_its_collectives(tmp_path, monkeypatch):
    """While the job trains, every node sends ``entry_times`` every SAMPLE_EVERY seconds: for the collectives
    every rank picks alike, rank 3 (which sleeps 50 ms before each all-reduce) enters them last."""
    pytest.importorskip("torch")
    received = spy_on(monkeypatch, Kind.ENTRY_TIMES, read_entry_times)

    def entered() -> dict[int, dict[int, int]]:
        """rank -> sequence number -> when it entered (every sample of each rank: each reports a number once)."""
        times: dict[int, dict[int, int]] = {}
        for samples in received:
            for sample in samples:
                for group in sample.groups:
                    times.setdefault(sample.rank, {}).update(zip(group.seqs, group.created_ns))
        return times

    def common() -> set[int]:
        times = entered()
        return set.intersection(*(set(t) for t in times.values())) if len(times) == 4 else set()

    run_over_the_channel(tmp_path, SLOWER_EACH_STEP, {}, until=lambda: len(common()) >= 3)
    times, seqs = entered(), sorted(common())
    assert len(seqs) >= 3, received
    for seq in seqs:
        last = max(times, key=lambda rank: times[rank][seq])
        assert last == 3, (seq, {rank: times[rank][seq] for rank in times})
        others = sorted(times[rank][seq] for rank in times if rank != 3)
        assert times[3][seq] - others[-1] > 20_000_000  # 50 ms late, give or take the machine's load


@pytest.mark.slow
@pytest.mark.torch
def test_a_failure_keeps_the_other_ranks_collectives_in_the_report(tmp_path):
    """Rank 2 fails after the 5 all-reduces while the others wait in the 6th: their records, read before they
    are stopped, are in the node's failure report and failure.json."""
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    # os._exit: a rank that leaves with its gloo group alive may abort in teardown instead (SIGABRT, with or without
    # telemetry: docs/compatibility.md#an-abort-at-exit-gloo), and this test is about the others' records. A child
    # holds its gloo sockets open until the stop (a process of its session): else the others' gloo sees them close
    # and may fail on its own before the agent reads them, and then their records are a problem, not a wait
    script.write_text(SKIPS_ONE.replace("    evaluate()\n",
                                        "    if os.fork() == 0:\n        time.sleep(120)\n        os._exit(0)\n"
                                        "    os._exit(3)\n"))
    logs = tmp_path / "logs"
    result = run_xrun("--num_gpus", "3", "--master_port", "0", "--log_dir", str(logs), str(script),
                      env={"TMPDIR": short_tmpdir()}, timeout=180)
    assert result.returncode == 3, result.stderr
    failure = json.loads((logs / "localhost" / "failure.json").read_text())
    assert failure["root_cause"] == 2
    by_rank = {r["rank"]: r for r in failure["collectives"]["ranks"]}
    # the failed rank ended with os._exit: no exit path, nothing left (issue 37 §2), and it is not asked (its child
    # holds its socket); the others are read
    assert by_rank.pop(2)["problem"] == ENDPOINT_GONE
    waiting, _ = waiting_and_late(list(by_rank.values()))
    assert sorted(waiting) == [0, 1]
    assert "collective records of 2 of 3 ranks (torch's Flight Recorder) in " in result.stderr


TIMES_OUT = r"""
import datetime, os, time
import torch
import torch.distributed as dist

def evaluate():
    time.sleep(120)

# every rank has imported torch before one makes the group: under load the imports end seconds apart, more than
# the short timeout the group is made with
ready = os.environ["READY_DIR"]
open(os.path.join(ready, os.environ["RANK"]), "w").close()
while len(os.listdir(ready)) < int(os.environ["WORLD_SIZE"]):
    time.sleep(0.05)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=6))
rank = dist.get_rank()
t = torch.ones(4096)
for _ in range(20):
    dist.all_reduce(t)
print("rank", rank, "trained", flush=True)
if rank == 2:
    evaluate()
dist.all_reduce(t)
"""


@pytest.mark.slow
@pytest.mark.torch
def test_a_failure_where_every_waiting_rank_times_out_at_once_names_the_rank_that_never_entered(tmp_path):
    """Issue 37 §2: 4 gloo ranks, rank 2 stalls before all-reduce #21, the others wait in it until gloo's timeout
    fails them all at once. Their sockets go while the agent asks; what each left at its exit says it waited in
    #21: the report and failure.json name rank 2 as the rank that never entered it."""
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(TIMES_OUT)
    (tmp_path / "ready").mkdir()
    logs = tmp_path / "logs"
    tmp = short_tmpdir()
    result = run_xrun("--num_gpus", "4", "--master_port", "0", "--log_dir", str(logs), str(script),
                      env={"TMPDIR": tmp, "READY_DIR": str(tmp_path / "ready")}, timeout=180)
    assert result.returncode == 1, result.stderr
    cause = ("all_reduce #21 on the default group ([4096] float32): ranks 0-1, 3 wait in it; rank 2 (localhost) "
             "never entered — at job.py:7 evaluate")
    assert f"    {cause}\n" in result.stderr, result.stderr
    assert "collective records of 4 of 4 ranks (torch's Flight Recorder, 3 of them as left at their exit) in " \
           in result.stderr
    failure = json.loads((logs / "localhost" / "failure.json").read_text())
    findings = failure["collectives"]["findings"]
    assert findings["root_cause"] == cause and not findings["unread"]
    [stuck] = findings["stuck"]
    assert (stuck["seq"], stuck["waiting"], [a["rank"] for a in stuck["absent"]]) == (21, [0, 1, 3], [2])
    full = json.loads(open(failure["collectives"]["file"]).read())
    assert {r: v["at_exit"] for r, v in full["ranks"].items()} == {"0": True, "1": True, "2": False, "3": True}
    assert os.listdir(tmp) == []  # what the ranks left went with the socket directory


NEVER_IMPORTS_TORCH = r"""
import os, sys, time
time.sleep(1)
if os.environ["RANK"] == "1":
    sys.exit(7)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_failed_job_without_a_process_group_reports_no_collectives(tmp_path):
    """Issue 37 §6: a script that never imports torch; one rank exits 7. No rank had a process group: the report
    and failure.json say nothing of collectives."""
    script = tmp_path / "job.py"
    script.write_text(NEVER_IMPORTS_TORCH)
    logs = tmp_path / "logs"
    result = run_xrun("--num_gpus", "4", "--master_port", "0", "--log_dir", str(logs), str(script),
                      env={"TMPDIR": short_tmpdir()}, timeout=120)
    assert result.returncode == 7, result.stderr
    assert "rank 1 failed first: exit code 7" in result.stderr
    assert "collective" not in result.stderr and "endpoint" not in result.stderr, result.stderr
    failure = json.loads((logs / "localhost" / "failure.json").read_text())
    assert failure["root_cause"] == 1 and failure["collectives"] is None


def fail_over_the_channel(tmp_path, script: str) -> tuple[int, str]:
    """``script`` on 3 agents (2 + 1 + 1 ranks, all on this machine) over the control channel until it fails on
    its own: the job's exit code, and the head's log directory."""
    path = tmp_path / "job.py"
    path.write_text(script)
    (tmp_path / "ready").mkdir()
    logs = tmp_path / "logs"
    options = dataclasses.replace(AgentOptions(), log_dir=str(logs))
    request = JobRequest(script=str(path), master_port=0, launch=LaunchOptions(python=sys.executable),
                         env={"TMPDIR": short_tmpdir(), "READY_DIR": str(tmp_path / "ready")}, cwd=str(tmp_path),
                         options=options)
    plan = make_plan(request, {"localhost": (0, 1), "127.0.0.1": (0,), "127.0.0.2": (0,)}, "ssh")
    server = head_server(plan, join_timeout=60, status=PlainStatus(3))
    port = server.listen(["127.0.0.1"])
    sessions = LocalSessions(plan, endpoint_of(server, port))
    try:
        return server.run(sessions), str(logs)
    finally:
        sessions.terminate()


@pytest.mark.slow
@pytest.mark.torch
def test_over_the_channel_the_heads_failure_json_names_the_rank_that_never_entered(tmp_path):
    """Issue 37 §2 across nodes: rank 2 (alone on its node) stalls before all-reduce #21 and the others time out
    in it at once; the head's DIR/failure.json names rank 2."""
    pytest.importorskip("torch")
    code, logs = fail_over_the_channel(tmp_path, TIMES_OUT)
    assert code == 1
    with open(os.path.join(logs, "failure.json")) as f:
        findings = json.load(f)["collectives"]["findings"]
    [stuck] = findings["stuck"]
    assert (stuck["seq"], stuck["waiting"], [a["rank"] for a in stuck["absent"]]) == (21, [0, 1, 3], [2]), findings
    assert findings["root_cause"].startswith("all_reduce #21 on the default group ([4096] float32): ranks 0-1, 3 "
                                             "wait in it; rank 2 (127.0.0.1) never entered — at job.py:7 evaluate")


@pytest.mark.slow
def test_over_the_channel_a_job_without_a_process_group_reports_no_collectives(tmp_path):
    """Issue 37 §6 across nodes: no node sends collectives, the head writes no collective findings."""
    code, logs = fail_over_the_channel(tmp_path, NEVER_IMPORTS_TORCH)
    assert code == 7
    assert not os.path.exists(os.path.join(logs, "failure.json"))  # the head's: written for collective findings
    with open(os.path.join(logs, "localhost", "failure.json")) as f:  # rank 1's node
        node = json.load(f)
    assert node["root_cause"] == 1 and node["collectives"] is None
