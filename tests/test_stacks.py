"""Issue 13: third-party training stacks run under xrun unchanged and fast (real ranks, real files)."""

import os
import sys

import pytest

from tests.conftest import run_xrun
from xrun.launch.ranks import omp_threads

PRINT_OMP = "import os; print(os.environ.get('OMP_NUM_THREADS'))"


@pytest.mark.parametrize(
    ("env", "local_ranks", "cpus", "expected"),
    [
        ({}, 2, 16, {"OMP_NUM_THREADS": "8"}),
        ({}, 3, 16, {"OMP_NUM_THREADS": "5"}),
        ({}, 8, 2, {"OMP_NUM_THREADS": "1"}),  # never 0
        ({}, 1, 16, {}),  # one rank owns the node: the library's default is right
        ({"OMP_NUM_THREADS": "3"}, 4, 16, {}),  # the user's choice
        ({"OMP_NUM_THREADS": ""}, 4, 16, {}),  # set, even if empty
    ],
)
def test_omp_threads_table(env, local_ranks, cpus, expected):
    assert omp_threads(env, local_ranks, cpus) == expected


def test_omp_num_threads_shares_the_cpus_between_local_ranks(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = run_xrun("--num_gpus", "2", "--no_python", "--no_local_rank", sys.executable, "-c", PRINT_OMP)
    assert result.returncode == 0, result.stderr
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert sorted(result.stdout.splitlines()) == [f"[localhost:0] {share}", f"[localhost:1] {share}"]
    assert result.stderr.count(f"OMP_NUM_THREADS={share} for each of 2 ranks") == 1


def test_omp_num_threads_of_the_user_and_of_a_single_rank_are_kept(monkeypatch):
    result = run_xrun("--num_gpus", "2", "--no_python", "--no_local_rank", sys.executable, "-c", PRINT_OMP,
                      env={"OMP_NUM_THREADS": "3"})
    assert sorted(result.stdout.splitlines()) == ["[localhost:0] 3", "[localhost:1] 3"]
    assert "OMP_NUM_THREADS" not in result.stderr
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = run_xrun("--no_python", "--no_local_rank", sys.executable, "-c", PRINT_OMP)
    assert result.stdout == "[localhost:0] None\n"
    assert "OMP_NUM_THREADS" not in result.stderr
