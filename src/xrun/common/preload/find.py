"""Whether the modules to preload can be found by the ranks' interpreter, without importing any of them: the dry
run's check of ``--preload`` (the run checks it too, before any rank starts; the helper's import then says what
else is wrong). Each dotted part is looked up by the path finder on the ranks' sys.path, as ``import`` would find
it, so no package's ``__init__`` runs. Another interpreter than this one is asked in a process of its own, which
runs this module's ``main``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib.machinery import PathFinder

from xrun.errors import PreloadError

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_ASK = "import sys; sys.path[0] = sys.argv.pop(1); from xrun.common.preload.find import main; main()"
_ASK_TIMEOUT = 60.0  # s: an interpreter's start and a few directory lookups


def check_findable(python: str, modules: Sequence[str], path0: str) -> None:
    """``PreloadError`` (exit code 2) naming the first of ``modules`` that ``python``, with ``path0`` as its
    sys.path[0], cannot find, and what to do."""
    problems = _here(modules, path0) if _is_this_python(python) else _ask(python, modules, path0)
    for name, problem in zip(modules, problems):
        if problem is not None:
            raise PreloadError(f"--preload: {problem}: install {name!r} for {python} (or put its directory on "
                               "PYTHONPATH), or leave it out of --preload", module=name)


def missing(name: str, path: list[str]) -> str | None:
    """Why ``name`` cannot be found on ``path`` (None: it can), each dotted part by the path finder."""
    parts = name.split(".")
    if parts[0] in sys.builtin_module_names:
        return None
    for depth, part in enumerate(parts):
        spec = PathFinder.find_spec(part, path)
        if spec is None:
            return f"no module {'.'.join(parts[: depth + 1])!r}"
        path = list(spec.submodule_search_locations or [])
        if not path:  # a module, not a package: what its import adds (os.path) cannot be known without running it
            return None
    return None


def main() -> None:
    """In the ranks' interpreter: ``python -c _ASK ROOT PATH0 MODULE...`` prints each module's problem as JSON."""
    path0, modules = sys.argv[1], sys.argv[2:]
    print(json.dumps(_here(modules, path0)))


def _here(modules: Sequence[str], path0: str) -> list[str | None]:
    path = [path0, *sys.path[1:]]  # the ranks' sys.path: their script's directory, then this interpreter's own
    return [missing(name, path) for name in modules]


def _ask(python: str, modules: Sequence[str], path0: str) -> list[str | None]:
    try:
        done = subprocess.run([python, "-c", _ASK, _ROOT, path0, *modules], capture_output=True, text=True,
                              timeout=_ASK_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise PreloadError(f"--preload: cannot ask {python} where its modules are ({type(err).__name__}: {err})") \
            from None
    try:
        found = json.loads(done.stdout)
    except ValueError:  # not a python (--python bash runs a shell script, which cannot be forked), or a broken one
        said = done.stderr.strip().splitlines()
        raise PreloadError(f"--preload: {python} did not answer as a Python interpreter (exit code {done.returncode}"
                           + (f": {said[-1].strip()}" if said else "") + "); only ranks that python runs can be "
                           "forked from the helper: leave --preload out") from None
    return [None if p is None else str(p) for p in found]


def _is_this_python(python: str) -> bool:
    found = shutil.which(python)
    return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)
