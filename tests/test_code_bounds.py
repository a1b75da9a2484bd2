"""Bounds that keep the code readable at 3 a.m. (issue 21): no function over 50 lines.

Read from the source with ast: a function that grows past its bound fails here with its file and name, so it is
split by responsibility when it grows, not years later. Classes have no bound any more: a class that is one state
machine reads best whole, and one is split by responsibility, never to get under a number.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = Path(ROOT) / "xrun"
MAX_FUNCTION_LINES = 50


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


def test_no_function_over_its_bound():
    assert [(name, n) for kind, name, n in spans() if kind == "function" and n > MAX_FUNCTION_LINES] == []
