"""The import graph of the project, read from the source with ``ast`` (module-level,
function-local and ``if TYPE_CHECKING:`` imports, and ``importlib.import_module("...")``
with a literal name). A type-only import is an edge like any other: it never runs, but a
circle of annotations is still two modules that cannot be understood one without the
other (break it with a ``typing.Protocol`` in the lower module, or a shared type moved
down):

- the harness (``gameday``, ``probes``, ``locustfiles``) never imports ``canarystack``;
- ``canary_contract`` imports only the standard library and pydantic;
- no import cycle among the project's modules (a cycle is reported as a path).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("canary_contract", "canarystack", "gameday", "probes", "locustfiles", "bench")
HARNESS = ("gameday", "probes", "locustfiles")
CONTRACT_MAY_IMPORT = frozenset({"pydantic", "pydantic_core", "typing_extensions"})


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str  # the dotted name as written (resolved for relative imports)
    line: int
    local: bool  # inside a function
    type_only: bool = False  # under ``if TYPE_CHECKING:``

    def where(self) -> str:
        kind = "function-local import" if self.local else "import"
        if self.type_only:
            kind = f"TYPE_CHECKING {kind}"
        return f"{module_path(self.importer)}:{self.line} ({kind} of {self.imported})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path)] = path
    return found


def module_path(name: str) -> str:
    return str(modules()[name].relative_to(ROOT))


class _Visitor(ast.NodeVisitor):
    def __init__(self, name: str, is_package: bool) -> None:
        self.name = name
        self.package = name if is_package else name.rpartition(".")[0]
        self.depth = 0
        self.type_only = 0
        self.found: list[Import] = []

    def _add(self, imported: str, node: ast.stmt | ast.expr) -> None:
        found = Import(self.name, imported, node.lineno, self.depth > 0, self.type_only > 0)
        self.found.append(found)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        # ``if TYPE_CHECKING:`` imports are seen like the others, only marked type-only.
        test = node.test
        name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        self.visit(test)
        self.type_only += 1
        for child in node.body:
            self.visit(child)
        self.type_only -= 1
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join([*base, node.module] if node.module else base)
        else:
            origin = node.module or ""
        for alias in node.names:
            candidate = f"{origin}.{alias.name}"
            self._add(candidate if candidate in modules() else origin, node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if (
            called in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            self._add(node.args[0].value, node)
        self.generic_visit(node)


@cache
def imports() -> tuple[Import, ...]:
    out: list[Import] = []
    for name, path in modules().items():
        visitor = _Visitor(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), str(path)))
        out.extend(visitor.found)
    return tuple(out)


def project_module(imported: str) -> str | None:
    """The project module an import names (its longest prefix that is one), or None."""
    parts = imported.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules():
            return candidate
        parts.pop()
    return None


def in_package(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


# ---------------------------------------------------------------------- the graph
@cache
def graph() -> dict[str, dict[str, Import]]:
    """importer -> {imported project module: the first import that makes the edge}."""
    edges: dict[str, dict[str, Import]] = {name: {} for name in modules()}
    for imp in imports():
        target = project_module(imp.imported)
        if target is not None and target != imp.importer:
            edges[imp.importer].setdefault(target, imp)
    return edges


def strongly_connected() -> list[list[str]]:
    """Tarjan's components with more than one module, each sorted, in a stable order."""
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges)))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def cycle_path(component: list[str]) -> list[Import]:
    """One cycle through the component's first module, as the imports that make it."""
    edges, members, start = graph(), set(component), component[0]
    # Breadth-first from start back to start, inside the component: the shortest cycle.
    previous: dict[str, Import] = {}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w, imp in sorted(edges[v].items()):
            if w not in members:
                continue
            if w == start:
                path = [imp]
                while v != start:
                    path.append(previous[v])
                    v = previous[v].importer
                return path[::-1]
            if w not in previous:
                previous[w] = imp
                queue.append(w)
    raise AssertionError(f"no cycle through {start} in {component}")


def describe(component: list[str]) -> str:
    path = cycle_path(component)
    names = " -> ".join([path[0].importer, *(imp_target(i) for i in path)])
    extra = f" (the component holds {len(component)} modules)" if len(component) > len(path) else ""
    return f"{names}{extra}: " + "; ".join(i.where() for i in path)


def imp_target(imp: Import) -> str:
    target = project_module(imp.imported)
    assert target is not None
    return target


def cycles() -> dict[tuple[str, ...], str]:
    return {tuple(c): describe(c) for c in strongly_connected()}


# ---------------------------------------------------------------------- the tests
def test_the_scan_sees_the_imports_it_judges() -> None:
    edges = graph()
    # a module-level, a function-local and a relative-free package import are all seen
    assert "canary_contract.buckets" in edges["canarystack.common.buckets"]
    assert "gameday.load.records" in edges["gameday.load.runner"]
    assert any(i.local for i in imports() if i.importer == "gameday.run.plan")
    assert "gameday.targets.local" in edges["gameday.targets"]
    assert any(i.type_only for i in imports())
    assert len(modules()) > 150


def test_type_checking_imports_are_edges() -> None:
    source = (
        "import typing\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from gameday.targets.base import Target\n"
        "else:\n"
        "    import gameday.errors\n"
        "if typing.TYPE_CHECKING:\n"
        "    import gameday.targets.local\n"
    )
    visitor = _Visitor("gameday.observers.broker", is_package=False)
    visitor.visit(ast.parse(source))
    seen = {i.imported: i.type_only for i in visitor.found}
    assert seen == {
        "typing": False,
        "gameday.targets.base": True,
        "gameday.errors": False,
        "gameday.targets.local": True,
    }
    assert "TYPE_CHECKING import" in visitor.found[2].where()


def _harness_imports_of_canarystack() -> Iterator[Import]:
    for imp in imports():
        if in_package(imp.importer, HARNESS) and in_package(imp.imported, ("canarystack",)):
            yield imp


def test_the_harness_never_imports_canarystack() -> None:
    found = [imp.where() for imp in _harness_imports_of_canarystack()]
    assert not found, (
        "the harness (gameday, probes, locustfiles) must reach the stack only over the "
        "wire; import canary_contract instead:\n" + "\n".join(found)
    )


def test_the_contract_imports_only_the_standard_library_and_pydantic() -> None:
    found = []
    for imp in imports():
        if not in_package(imp.importer, ("canary_contract",)):
            continue
        top = imp.imported.split(".")[0]
        if top == "canary_contract" or top in sys.stdlib_module_names:
            continue
        if top not in CONTRACT_MAY_IMPORT:
            found.append(imp.where())
    assert not found, (
        "canary_contract is pure data both halves import: standard library and pydantic "
        "only:\n" + "\n".join(found)
    )


def test_no_import_cycle() -> None:
    found = cycles()
    assert not found, (
        "import cycles (break them; never hide one behind a local import or a TYPE_CHECKING "
        "block):\n" + "\n".join(found.values())
    )


# The evidence core's own project imports: itself, the harness's error root and wire reader.
EVIDENCE_CORE_MAY_IMPORT = ("gameday.evidence", "gameday.errors", "gameday.oracle.wire")


def test_the_evidence_core_never_imports_the_injectors_or_the_runner() -> None:
    """The pure evidence core sits below everything that acts on a target: the ledger's
    entries and roles live in it (``gameday.evidence.ledger``), not in the injectors."""
    found = [
        imp.where()
        for imp in imports()
        if in_package(imp.importer, ("gameday.evidence",))
        and in_package(imp.imported, ("gameday", "probes"))
        and not in_package(imp.imported, EVIDENCE_CORE_MAY_IMPORT)
    ]
    assert not found, "the evidence core imports the harness above it:\n" + "\n".join(found)
