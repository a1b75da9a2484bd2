"""Telemetry's contract: the collective records as they cross the channel (``records``, pure).
What runs in the ranks, their endpoints and what reads them are ``xrun.launch.telemetry``.
"""

DEFAULT_GROUP = "0"  # torch's name of the default process group, on every rank
