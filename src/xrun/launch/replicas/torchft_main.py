"""torchft's Lighthouse, started without importing torch: ``python .../xrun/launch/replicas/torchft_main.py ARGS``
is ``torchft_lighthouse ARGS`` (run by its path: torchft's parser reads the process's own argv and skips one word
after the interpreter, as its console script has it).

torchft's own entry point imports the ``torchft`` package, and with it torch, before its Rust server starts: 2.7 s
to listen on this project's machine, against 0.07 s here, where only the extension (``torchft._torchft``, which
needs no torch) is loaded. A restart is that much shorter, and a quorum that a group starts in the gap fails:
torchft 0.2.0's Manager does not recover from it (docs/replica-groups.md). Standard library only.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

NAME = "torchft._torchft"


def extension() -> str | None:
    """The path of torchft's extension for this interpreter (None: torchft is not installed here). ``find_spec``
    of a top-level package runs none of its code."""
    spec = importlib.util.find_spec("torchft")
    for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
        for name in sorted(os.listdir(folder)):
            if name.startswith("_torchft.") and name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
                return os.path.join(folder, name)
    return None


def main() -> int:
    path = extension()
    if path is None:
        print(f"xrun: torchft is not installed for {sys.executable}: pip install torchft", file=sys.stderr)
        return 2
    loader = importlib.machinery.ExtensionFileLoader(NAME, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(NAME, loader))  # type: ignore[arg-type]
    loader.exec_module(module)
    return int(module.lighthouse_main() or 0)


if __name__ == "__main__":
    sys.exit(main())
