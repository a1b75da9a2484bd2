"""The job at the head: the pure state machine (``machine.Job``) and its rules, one concept a module (nodes, barrier,
stop, verdict, hellos, attempts and restart, spares, faulty nodes, rejoin), its events; the control server around
it (``server.ControlServer``: the loop and its connections; ``dispatch``: events in, actions carried out; ``wire``:
messages as events; ``extras``), the console relay, the live status and the head's side of the hang doctor.

May import ``runner.hosts``, the head's request and plan modules, ``xrun.launch`` and ``xrun.channel``.
"""
