"""The job at the head: the pure state machine, its events and verdict, the control server around it, the
console relay, the live status and the head's side of the hang doctor.

May import ``runner.hosts``, the head's request and plan modules, ``xrun.launch`` and ``xrun.channel``.
"""
