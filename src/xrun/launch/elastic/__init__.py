"""``--elastic``: a node's ranks under torch's elastic agent (its rendezvous settings, pure, are
``xrun.common.rdzv``: the head renders them too).

The only place of xrun that imports torch (``torch_agent``, lazily). May import every other folder of the node
layer.
"""
