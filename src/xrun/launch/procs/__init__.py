"""Processes as the kernel sees them: POSIX helpers, the ``/proc`` table, signal ownership, the watchdog.

The bottom of the node layer: imports only the standard library and ``xrun``'s shared modules.
"""
