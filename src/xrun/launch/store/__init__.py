"""The store torchrun's agent gives its workers (issue 39 §1): a server of torch's c10d TCPStore protocol, in
pure Python, so that ranks started with ``TORCHELASTIC_USE_AGENT_STORE=True`` (and any script that opens
``TCPStore(MASTER_ADDR, MASTER_PORT, is_master=False)``) find a store at ``MASTER_ADDR:MASTER_PORT``.

``wire`` (the requests and answers as bytes; pure), ``table`` (what the store holds and what each request does to
it; pure), ``server`` (``StoreServer``: the selector loop on its own thread). Standard library only, no torch: it
sits at the bottom of the node layer, beside ``procs``, and imports nothing of ``xrun`` but itself.
``agent_store`` (where an agent hosts one) loads ``server`` only where it does: this package re-exports nothing, so
that every agent that hosts no store (all but rank 0's node) skips its import (issue 38).
"""
