"""The node agent's side of the control channel: one pure state machine and the one driver that runs it.

``events`` (what the machine hears and what it asks for) < ``pod`` (pod mode's node, as the head layer hands it
over) < ``machine`` (``AgentMachine``: events in, actions out, one exit code; no socket, thread, clock or process)
< ``connection`` (TCP, TLS, the proofs, the hello, with the retries both modes need; the open link's reader and
sender) < ``driver`` (runs the machine for head mode, hot spares, restarts and pod mode alike: the inbox, the
preflight, the ranks, the console) < ``main`` (``python -m xrun.launch --connect``: its command line and key).

The top of the node layer: may import every other part of it, and ``xrun.channel``; never ``xrun.runner``.
"""
