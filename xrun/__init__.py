"""xrun: a lean multi-node launcher for PyTorch training.

The package has two layers: ``xrun.runner`` (head node: decides what runs where) and ``xrun.launch`` (every
node: turns one node spec into supervised rank processes). ``launch`` never imports ``runner``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
