"""Where the nodes come from: hostfiles, the local default, --include/--exclude, batch allocations, platforms.

The bottom of the head layer: imports ``xrun.common`` (devices) and ``xrun``'s shared modules, nothing else of
``xrun.runner``.
"""
