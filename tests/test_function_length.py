"""Functions once over ~100 lines stay split by idea (issue #30): each of these is at most
100 lines, its docstring included (read from the source with ``ast``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 100
# (file, function; Class.method for a method)
SPLIT = (
    ("gameday/report/synthetic.py", "write_experiment"),
    ("gameday/load/options.py", "add_arguments"),
    ("canarystack/broker/api_spec.py", "describe"),
    ("canarystack/rollback/executor.py", "RollbackRunner._routers_applied"),
    ("gameday/run/plan.py", "plan_run"),
    ("gameday/report/build.py", "build_report"),
    ("gameday/run/verdict.py", "decide"),
    ("canarystack/gate/tripper.py", "write_trip"),
)


def find_function(path: Path, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The definition of ``qualname`` (``name`` or ``Class.name``) at ``path``'s top level."""
    body: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    *outer, name = qualname.split(".")
    for cls in outer:
        body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == cls)
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    raise LookupError(f"{path.relative_to(ROOT)}: no function {qualname}")


@pytest.mark.parametrize(("path", "qualname"), SPLIT, ids=[q for _, q in SPLIT])
def test_the_function_is_at_most_100_lines(path: str, qualname: str) -> None:
    node = find_function(ROOT / path, qualname)
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    assert lines <= MAX_LINES, (
        f"{path}: {qualname} is {lines} lines (at most {MAX_LINES}): split it by idea (#30)"
    )
