"""The head and a node in one process, above both layers, and the entries that hand them on.

``one_node`` is a one-node job (the local run's and, through ``standalone``, the stand-alone agent's) and ``pod``
pod mode's runtime on each node: each joins the head's control server (``xrun.runner``) and the node's driver
(``xrun.launch``) inside xrun's process. ``entry`` (the console script's and ``python -m xrun``'s, from
``xrun.__main__``) hands them to the head's command line (``xrun.runner.cli``) as ``InProcess``; each loads its
modules at its first call, so a dry run, ``xrun check`` and a multi-node job's head load neither the node's driver
nor, for the local run, pod mode's runtime. ``standalone`` is ``python -m xrun.launch``'s (``xrun.launch.__main__``)
without ``--connect``: it loads neither the head's command line nor its planner. This ``__init__`` imports nothing,
so that each entry loads only its own path.

May import both layers and everything below them; nothing imports this folder but the entries (``xrun.__main__``,
``xrun.launch.__main__``): ``runner`` never imports ``launch`` and ``launch`` never imports ``runner``
(tests/test_layers.py).
"""
