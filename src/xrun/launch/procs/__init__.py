"""Processes as the kernel sees them: the ``/proc`` table and the watchdog (the POSIX helpers and signal ownership,
which the head uses too, are ``xrun.common.procs``).

The bottom of the node layer: imports only the standard library, ``xrun.common`` and ``xrun``'s shared modules.
"""
