"""Every rank's collective state, read on its node without the script's help (issue 31; docs/telemetry.md).

``site/`` is what runs inside each rank (a ``sitecustomize`` on its ``PYTHONPATH``: torch's Flight Recorder
served on a Unix socket; a rank forked from the preload helper calls it from xrun.launch.preload.become);
``endpoints`` makes the node's socket directory and each rank's environment; ``client`` asks the ranks' sockets;
``reads`` runs the questions beside the rank group's loop and keeps the full dumps on the node; ``usage`` reads
each rank's CPU and RSS from ``/proc`` every sample period for the head's record (issue 40 §1). What crosses the
channel is the shared layer's ``xrun.common.telemetry.records`` (pure: a Flight Recorder dump as the compact
summaries the head reads too).

Sits below the rank group (``launch.ranks`` builds the ranks' environment with it, ``launch.doctor`` asks): may
import ``launch.procs``, ``xrun.common`` and the channel. Imports no torch.
"""
