"""The record of a run (issue 40 §1): with ``--log_dir``, the head writes the job's events as they happen, on its own
clock, one JSON object a line, to ``DIR/events.jsonl`` (the format, field by field: docs/events.md), and sums up
the same events as the job's goodput in ``summary.json``.

* ``head.JobRecord``: what the control server (``xrun.runner.job.control_server``) registers where it feeds its
  machine: each event fed with the actions that came back, and the messages it reads beside the machine (the
  ranks' figures, the straggler samples and scores); it turns them into record lines;
* ``file.EventsFile``: the lines, buffered, written by a thread of their own (a slow disk never holds the head's
  loop) and bounded in size (the cap and what happens at it: its docstring);
* ``goodput.Goodput``: where the wall time went (training, start-up, restarts, hang detection, teardown), folded
  over the record's events: the live job's and, for a tool, a file's (``goodput_of``).

May import ``xrun.runner.job``'s events and machine and ``xrun.launch``'s results; nothing imports it but the
control server and ``xrun.runner.job.metrics`` (``--metrics_port`` reads the record: its folds, ``head.Fold``).
"""
