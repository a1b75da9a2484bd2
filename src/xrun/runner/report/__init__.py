"""report.html (issue 40 §2): one self-contained page that draws a run from its record (docs/report.md).

* ``record.read_run``: a log directory's ``events.jsonl`` (docs/events.md), ``summary.json`` and ``failure.json``,
  read as they are, a torn last line (a live or killed run) skipped; anything else malformed is a ``RecordError``;
* ``model.report_of``: pure, the lines turned into what the page shows: the lanes (the job, each node, each rank)
  with their spans and marks, the lateness, CPU and memory series (thinned to a bound), the root cause in words,
  the command and the env contract;
* ``page.render``: the page itself: the charts drawn by plotly.js (its basic bundle, vendored in ``vendor/`` with
  its licence, embedded whole), every fact also in its text and tables, every string from the record escaped;
* ``command``: ``xrun report DIR`` and the head's ``write_report`` at the end of every run with ``--log_dir``.

May import ``xrun.common``; the control server (``xrun.runner.job.control_server``) and the command line import
it.
"""
