"""Node layer: turns one node spec into supervised rank processes. Never imports ``xrun.runner``."""
