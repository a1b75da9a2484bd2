"""Bounds that keep the code readable at 3 a.m. (issue 21): no function over 60 lines, no file over 600.

Read from the source with ast: a function or file that grows past its bound fails here with its name, so it is
split by responsibility when it grows, not years later. A class has no bound of its own (issue 30): one concept
that reads top to bottom, a state machine say, beats pieces glued together to fit a number.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = Path(ROOT) / "src" / "xrun"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 600


def spans() -> list[tuple[str, str, int]]:
    """(kind, 'path:name', lines) for every class and function of the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((kind, f"{path.relative_to(PACKAGE.parent)}:{node.name}", lines))
    return found


def test_the_bounds_see_the_code():
    kinds = {kind for kind, _, _ in spans()}
    assert kinds == {"class", "function"}


def test_no_file_over_its_bound():
    lengths = {str(path.relative_to(PACKAGE.parent)): len(path.read_text(encoding="utf-8").splitlines())
               for path in sorted(PACKAGE.rglob("*.py"))}
    assert [(name, n) for name, n in lengths.items() if n > MAX_FILE_LINES] == []


def test_no_function_over_its_bound():
    assert [(name, n) for kind, name, n in spans() if kind == "function" and n > MAX_FUNCTION_LINES] == []
