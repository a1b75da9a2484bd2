"""``--elastic``: a node's ranks under torch's elastic agent, and the rendezvous settings it is given.

The only place of xrun that imports torch (``torch_agent``, lazily). May import every other folder of the node
layer; ``rdzv`` is pure and imported by the agent's command rendering too.
"""
