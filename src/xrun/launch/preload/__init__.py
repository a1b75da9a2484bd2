"""Forking ranks from a preloaded process (issue 32): one helper per node imports the heavy modules once (torch,
transformers, ...) and every rank is forked from it instead of importing them again.

``helper`` is the helper process's program (it imports the modules it is told and nothing else, runs no user
code, and forks on the agent's order); ``become`` is what a forked copy of it does to turn into the rank, as a
``python`` started for that rank would be (a rank's command line read the way the interpreter would is
``xrun.common.preload.argv``, and the dry run's check that the ranks' interpreter finds the modules
``xrun.common.preload.find``); ``kernel`` holds the prctl calls both need; ``wire`` is the two ends' protocol over
a private socket pair; ``client`` is the agent's end (start the helper, fork a rank, notice its death). The rank group
(xrun.launch.ranks) supervises a forked rank as it supervises a started one: see docs/preload.md.

Imports only the standard library, ``xrun.launch.procs``, ``xrun.common.procs`` and ``xrun.common.preload``,
``xrun.parent_death`` and telemetry's in-rank module (``xrun.launch.telemetry.site``, standard library only: a
forked rank does its ``sitecustomize``'s work itself): the helper process loads this package, so it must stay
light and load nothing a rank would then carry without having asked for it.
"""
