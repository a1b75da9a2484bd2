"""xrun supports Python >= 3.9 (setup.py, README): no ``X | Y`` type union where Python evaluates it at import time.

``from __future__ import annotations`` keeps annotations as strings, but a base class, a decorator's arguments, a
default value or a module-level alias are evaluated when the module loads, and on 3.9 ``float | None`` there is a
``TypeError`` (it was: ``class Timers(list[tuple[Callable[[], float | None], ...]])`` broke every run on 3.9).
Read from the source with ast, so the check runs on whatever interpreter runs the suite.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = Path(ROOT) / "src" / "xrun"
TYPE_NAMES = {"int", "str", "float", "bool", "bytes", "object", "list", "tuple", "dict", "set", "frozenset", "type",
              "Callable", "Mapping", "Sequence", "Iterable", "Iterator", "Any"}


def _is_type(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if isinstance(node, ast.Subscript):
        return _is_type(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr in TYPE_NAMES
    return isinstance(node, ast.Name) and node.id in TYPE_NAMES


def type_unions(tree: ast.AST) -> list[int]:
    """Lines of ``A | B`` between types inside expressions evaluated at import time."""
    evaluated: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            evaluated += [*node.bases, *(k.value for k in node.keywords), *node.decorator_list]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            evaluated += [*node.args.defaults, *(d for d in node.args.kw_defaults if d), *node.decorator_list]
    evaluated += [n.value for n in getattr(tree, "body", []) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value]
    found = []
    for expr in evaluated:
        for node in ast.walk(expr):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and (
                    _is_type(node.left) or _is_type(node.right)):
                found.append(node.lineno)
    return found


def test_no_type_union_is_evaluated_at_import():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             for line in type_unions(ast.parse(path.read_text(encoding="utf-8")))]
    assert found == []


def test_the_check_sees_what_broke_3_9():
    broken = "class Timers(list[tuple[Callable[[], float | None], Callable[[], None]]]):\n    pass\n"
    alias = "Due = Callable[[], float | None]\n"
    default = "def f(x=int | None):\n    pass\n"
    fine = "def g(x: float | None = None) -> int | None:\n    return {1} | {2}\n"
    assert [bool(type_unions(ast.parse(src))) for src in (broken, alias, default, fine)] == [True, True, True, False]
