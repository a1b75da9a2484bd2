"""The open-files limit (issue 15): the soft limit is raised to the hard one at start, and a job that cannot fit
under the hard limit ends before anything starts with one line naming the number needed."""

import resource
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from xrun import fdlimit
from xrun.fdlimit import FDS_BASE, FDS_PER_RANK, OpenFilesError, agent_open_files, check_open_files
from xrun.runner.backends import backend_traits
from xrun.runner.plan import JobRequest, make_plan
from xrun.runner.validate import head_open_files


def plan_for(backend, hosts, slots=1):
    world = {f"node{i}": tuple(range(slots)) for i in range(hosts)}
    return make_plan(JobRequest(script="t.py"), world, backend)


@pytest.mark.parametrize(
    ("backend", "hosts", "slots", "needed"),
    [
        ("local", 1, 8, FDS_BASE + 8 * FDS_PER_RANK),  # the head is the agent: its ranks' pipes and logs
        ("pdsh", 1000, 8, FDS_BASE + 1000),  # one channel socket per node; the ranks are elsewhere
        ("openmpi", 1000, 8, FDS_BASE + 1000),
        ("ssh", 1000, 8, FDS_BASE + 4000),  # + the TCP connection and paramiko's wake-up pipe per host
        ("no_ssh", 3, 2, FDS_BASE + 2 * FDS_PER_RANK + 3),  # node 0 of a pod: its ranks and the server
    ],
)
def test_head_estimate_per_backend(backend, hosts, slots, needed):
    assert head_open_files(plan_for(backend, hosts, slots), backend_traits(backend)) == needed


def test_error_names_the_number_and_how_to_raise_it():
    text = str(OpenFilesError("this job's head node", 4064, 1024))
    assert text.startswith("this job's head node needs about 4064 open files, over the hard limit of 1024")
    assert "ulimit -Hn 4064" in text and "LimitNOFILE=4064" in text and "\n" not in text
    assert OpenFilesError("x", 2, 1).exit_code == 2


def fake_limits(monkeypatch, soft, hard):
    state = {"limits": (soft, hard)}
    monkeypatch.setattr(fdlimit.resource, "getrlimit", lambda _which: state["limits"])
    monkeypatch.setattr(fdlimit.resource, "setrlimit", lambda _which, limits: state.update(limits=limits))
    return state


def test_check_raises_the_soft_limit_when_the_hard_one_has_room(monkeypatch):
    state = fake_limits(monkeypatch, 1024, 65536)
    check_open_files("job", 5000)
    assert state["limits"] == (65536, 65536)


def test_check_refuses_past_the_hard_limit(monkeypatch):
    state = fake_limits(monkeypatch, 1024, 4096)
    with pytest.raises(OpenFilesError) as caught:
        check_open_files("job", 5000)
    assert (caught.value.needed, caught.value.limit) == (5000, 4096)
    assert state["limits"] == (1024, 4096)  # nothing changed


def test_unlimited_hard_limit_is_capped_at_nr_open(monkeypatch, tmp_path):
    nr_open = tmp_path / "nr_open"
    nr_open.write_text("1048576\n")
    monkeypatch.setattr(fdlimit, "_NR_OPEN", str(nr_open))
    state = fake_limits(monkeypatch, 1024, resource.RLIM_INFINITY)
    assert fdlimit.raise_open_files_limit() == 1048576
    assert state["limits"] == (1048576, resource.RLIM_INFINITY)


def test_agent_estimate_grows_with_ranks():
    assert agent_open_files(0) == FDS_BASE
    assert agent_open_files(1024) - agent_open_files(1023) == FDS_PER_RANK


# -- real processes: the limits set in the child before xrun starts (prlimit's job, done with preexec_fn) ----------


def run_limited(args, soft, hard, cwd):
    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.run([sys.executable, "-m", "xrun", *args], capture_output=True, text=True, timeout=60,
                          preexec_fn=lower, cwd=cwd, env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})


def test_a_job_over_the_hard_limit_ends_with_one_line(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"node{i} slots=8\n" for i in range(600)))
    result = run_limited(["-H", str(hostfile), "--launcher", "pdsh", "--dry-run", "t.py"], 256, 256, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"xrun: this job's head node needs about {FDS_BASE + 600} open files, over the hard limit of 256 "
        f"(ulimit -Hn); {fdlimit.HOW_TO_RAISE.format(n=FDS_BASE + 600)}\n"
    )


def test_ranks_run_with_the_soft_limit_raised_to_the_hard_one(tmp_path):
    script = tmp_path / "limit.py"
    script.write_text("import resource\nprint('soft', resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    result = run_limited(["--no_prefix", str(script)], 256, 2048, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "soft 2048\n"
