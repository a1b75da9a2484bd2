"""The job at the head: the pure state machine (``machine.Job``: every rule of the job, events in, actions out) with
the collaborators it owns (nodes, barrier, stop, verdict, attempts, spares, the hello policies) and its events; the
control server around it (``server.ControlServer``: accepts, turns what its connections read into events, feeds
the machine and carries out its actions; ``connections.Conn``: one connection's TLS and frames; ``loop.SelectLoop``:
the selector, timers and signals; ``gate``: who gets in), what the server reads beside the machine (the hang
doctor's head side, every rank's figures, ``--precheck``'s check) and the console relay; the job's last words
(``report``); the job's record, ``events.jsonl`` and its goodput (``record``); ``--metrics_port``'s figures for
Prometheus (``metrics``).

May import ``runner.hosts``, the head's request and plan modules, ``runner.network`` (the check ``--precheck`` runs,
and its decision), ``xrun.common`` (the join status line is ``xrun.common.output.status``) and ``xrun.channel``.
"""
