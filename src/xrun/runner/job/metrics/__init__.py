"""Live metrics (issue 40 §3): with ``--metrics_port PORT`` the head serves its figures in Prometheus's text format
(docs/metrics.md). The flags, typed, are ``xrun.runner.metrics_options`` (the request's layer).

* ``tally.RecordTally``: a fold over the record's lines (``xrun.runner.job.record``) for what the machine keeps no
  count of: the attempt, restarts by cause, ranks by state, nodes joined and lost, spares swapped; pure;
* ``exporter``: the HTTP server (``prometheus_client``'s, on threads of its own) and the collector that reads the
  head's state when Prometheus scrapes, and only then.

Nothing here is imported unless the flag is given (the control server imports ``exporter`` lazily): the launch
path stays without ``prometheus_client``. May import the rest of ``xrun.runner.job``, the plan and ``xrun.common``;
only the control server imports it.
"""
