"""xrun's entry (the console script's and ``python -m xrun``'s, from ``xrun.__main__``): the head's command line
(``xrun.runner.cli``), handed what joins the head and a node in one process (``InProcess``), each loaded at its
first call (see xrun.joined)."""

from __future__ import annotations

from collections.abc import Sequence

from xrun.runner import cli
from xrun.runner.backends.base import InProcess
from xrun.runner.plan import Plan


def one_node_job(plan: Plan) -> int:
    from xrun.joined.one_node import run_one_node_job  # lazy: see the module doc

    return run_one_node_job(plan)


def pod_share(plan: Plan) -> int:
    from xrun.joined.pod import run_pod  # lazy: see the module doc

    return run_pod(plan)


IN_PROCESS = InProcess(one_node_job=one_node_job, pod_share=pod_share)


def main(argv: Sequence[str] | None = None) -> int:
    """xrun's exit code for ``argv`` (``sys.argv[1:]`` when None)."""
    return cli.main(argv, IN_PROCESS)


def entry() -> None:
    """The console script's and ``python -m xrun``'s: run, then leave without the interpreter's teardown."""
    cli.entry(IN_PROCESS)
