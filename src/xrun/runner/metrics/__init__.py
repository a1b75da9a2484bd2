"""Live metrics (issue 40 §3): ``--metrics_port PORT`` serves the head's figures in Prometheus's text format.

* ``options``: the flags, typed (``MetricsOptions``), and their one-line errors;
* ``tally.RecordTally``: a fold over the record's lines (``xrun.runner.job.record``) for what the machine keeps no
  count of: attempts, restarts by cause, ranks by state, nodes joined and lost, spares swapped; pure;
* ``exporter``: the HTTP server (``prometheus_client``'s, on a thread of its own) and the collector that reads the
  head's state when Prometheus scrapes, and only then.

Nothing here is imported unless the flag is given (the control server imports ``exporter`` lazily): the launch
path stays without ``prometheus_client``. May import ``xrun.runner.job``, the plan and ``xrun.common``; the control
server imports it, the CLI, the plan and ``validate`` its options.
"""
