"""The head and a node in one process, above both layers, and xrun's entry, which hands them to the head.

``one_node`` is the local run's one-node job and ``pod`` pod mode's runtime on each node: each joins the head's
control server (``xrun.runner``) and the node's driver (``xrun.launch``) inside xrun's process. ``entry`` (the
console script's and ``python -m xrun``'s, from ``xrun.__main__``) hands them to the head's command line
(``xrun.runner.cli``) as ``InProcess``; each loads its modules at its first call, so a dry run, ``xrun check``
and a multi-node job's head load neither the node's driver nor, for the local run, pod mode's runtime.

May import both layers and everything below them; nothing imports this folder but ``xrun.__main__``: ``runner``
never imports ``launch`` and ``launch`` never imports ``runner`` (tests/test_layers.py).
"""

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
