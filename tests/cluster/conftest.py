"""Fixtures for tests that run on the network-namespace cluster (see harness.py).

* ``cluster``: 3 nodes, brought up once per session and shared.  Before every test that uses it, it is
  reset to a fresh state (links healed, every sshd running, nothing else on the nodes), so a test may kill or
  cut nodes freely.
* ``make_cluster``: ``make_cluster(n)`` builds a cluster of the test's own, torn down after the test.  Only
  one cluster can exist on the machine, so the shared one steps aside for the test (it comes back for the
  next test that uses ``cluster``).  Do not ask for both in one test.
* ``python``: the remote interpreter for ``--python``, a wrapper (``python_wrapper``) that puts this tree first on
  PYTHONPATH: over ssh nothing else would.

Every test under tests/cluster is marked ``cluster``.  Without root or the tools the tests skip with the
reason, unless ``XRUN_REQUIRE_CLUSTER=1`` (CI sets it): then they fail, so they can never silently skip there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from . import harness
from .harness import Cluster, missing_requirements
from .jobs import python_wrapper

HERE = Path(__file__).resolve().parent
REQUIRE_ENV = "XRUN_REQUIRE_CLUSTER"
TEST_TOOLS = ("pdsh",)  # used by the tests themselves, not by the harness

_shared: list[Cluster] = []  # the session cluster, once created


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.cluster)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if harness.stats["claim_s"] >= 1:  # other sessions' clusters held the machine: say why the run was slow
        terminalreporter.write_line(
            f"xrun-cluster: {harness.stats['claim_s']:.1f} s waiting for other clusters on this machine "
            "(one cluster at a time; `python -m tests.cluster.harness status` shows who holds it)"
        )


def require_cluster() -> None:
    """Skip (or, under XRUN_REQUIRE_CLUSTER=1, fail) when this machine cannot build the cluster."""
    problems = missing_requirements(extra_tools=TEST_TOOLS)
    if problems:
        _unavailable("network-namespace cluster unavailable: " + "; ".join(problems))


def require_cpu_limit() -> None:
    """Skip (or fail, as `require_cluster`) where no cgroup can limit a node's CPU (``Cluster.cpu_limited``)."""
    if harness.cpu_controller() is None:
        _unavailable("no cgroup cpu controller to limit a node's CPU with (cgroup v2 cpu.max, or v1's cfs quota)")


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: cluster tests must run here)", pytrace=False)
    pytest.skip(f"{reason} (set {REQUIRE_ENV}=1 to make this an error)")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    require_cluster()
    shared = Cluster(3)
    _shared.append(shared)
    try:
        yield shared  # brought up (and reset) by _fresh_cluster before each test that uses it
    finally:
        _shared.remove(shared)
        shared.down()


@pytest.fixture(autouse=True)
def _fresh_cluster(request: pytest.FixtureRequest) -> None:
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").ensure_healthy()


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., Cluster]]:
    require_cluster()
    for shared in _shared:
        shared.down()  # one cluster per machine: node names, addresses and the ssh drop-in are global
    made: list[Cluster] = []

    def make(n: int = 3, **kwargs: object) -> Cluster:
        cluster = Cluster(n, **kwargs)  # type: ignore[arg-type]
        made.append(cluster)
        return cluster.up()

    try:
        yield make
    finally:
        for cluster in reversed(made):
            cluster.down()


@pytest.fixture
def python(tmp_path: Path) -> str:
    """The remote interpreter: this tree first on PYTHONPATH (over ssh nothing else would), at tmp_path/python."""
    return python_wrapper(tmp_path / "python")
