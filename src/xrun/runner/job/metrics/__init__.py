"""Live metrics (issue 40 §3): with ``--metrics_port PORT`` the head serves its figures in Prometheus's text format
(docs/metrics.md). The flags, typed, are ``xrun.runner.metrics_options`` (the request's layer).

* ``tally.RecordTally``: a fold over the record's lines (``xrun.runner.job.record``) for what the machine keeps no
  count of: the attempt, restarts by cause, ranks by state, nodes joined and lost, spares swapped; pure;
* ``exporter``: the HTTP server (on threads of its own) and the page it serves, read from the head's state when
  Prometheus scrapes, and only then;
* here, ``record_and_metrics``: what the control server keeps of the job beside its machine, the record and the
  server that reads it.

``exporter`` (and ``prometheus_client`` with it) is imported only when the flag is given, the record only with
``--log_dir`` or ``--metrics_port``: the launch path stays lean. May import the rest of ``xrun.runner.job``, the
plan and ``xrun.common``; only the control server imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from xrun.common.result.stragglers import StragglerScores
    from xrun.runner.job.machine import Job
    from xrun.runner.job.metrics.exporter import MetricsServer
    from xrun.runner.job.record.head import JobRecord
    from xrun.runner.plan import Plan


def record_and_metrics(plan: Plan, job: Job, stragglers: Callable[[], StragglerScores], *,
                       now: float) -> tuple[JobRecord | None, MetricsServer | None]:
    """The job's record (with ``--log_dir``: its file; with ``--metrics_port`` alone: its folds only) and
    ``--metrics_port``'s server, bound before the record opens its file (a port refused costs nothing else) and
    reading the record and ``stragglers()`` (the current attempt's scores) at each scrape."""
    log_dir, options = plan.request.options.log_dir, plan.request.metrics
    if log_dir is None and options is None:
        return None, None
    # Lazy: the record (its writer thread's queue, the goodput fold, the events' names) loads only with a flag
    # that asks for it, not at every job's start (a local run's, issue 38's speed bound)
    from xrun.runner.job.record.head import JobRecord

    if options is None:
        return (JobRecord(plan, job, log_dir=log_dir, now=now) if log_dir else None), None
    from xrun.runner.job.metrics.exporter import MetricsServer  # lazy: prometheus_client only with the flag

    metrics = MetricsServer(plan, options)
    record = JobRecord(plan, job, log_dir=log_dir, now=now, folds=(metrics.tally,))
    metrics.serve(job, record, stragglers)
    return record, metrics
