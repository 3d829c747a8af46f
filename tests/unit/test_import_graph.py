"""The import graph of sgl/, read with ast from the source files (nothing is imported).

Two rules: no cycle anywhere in sgl/ among module-level imports (what runs at import time;
imports under `if TYPE_CHECKING:` do not run and are left out), and none at all, function-level
imports included, among the model modules and the tokenizer / detokenizer / stop modules. A
function-level import is how a cycle is usually hidden; there it still means two modules that
each need the other (e.g. the CPU packing pass that had to know every layer kind: now each
layer packs itself, cpu_packed.CpuPackable). Edges go to the module named (`from a.b import c`:
to `a.b.c` where that is a module, else `a.b`), not to the packages above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SGL = Path(__file__).resolve().parents[2] / "sgl"
# Function-level imports count here too: the quantization cluster and the CPU packing pass
# (issue 45), and the text modules split out of tokenizer.py.
ACYCLIC_EVEN_LAZILY = (
    "sgl.runtime.model.",
    "sgl.runtime.tokenizer",
    "sgl.runtime.detokenizer",
    "sgl.runtime.stop_strings",
    "sgl.runtime.stop_regex",
)


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at `root`."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: list[ast.stmt], lazy: bool):
    """The import statements of `body` that run at import time (and, with `lazy`, those in
    functions and classes too)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _type_checking_only(node):
                yield from _imports(node.body, lazy)
            yield from _imports(node.orelse, lazy)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _imports(block, lazy)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            yield from _imports(node.body, lazy)
        elif lazy and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _imports(node.body, lazy)


def import_graph(root: Path, lazy: bool) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8")).body, lazy):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets.update(
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            )
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _induced(graph: dict[str, set[str]], prefixes: tuple[str, ...]) -> dict[str, set[str]]:
    keep = {m for m in graph if m.startswith(prefixes)}
    return {m: graph[m] & keep for m in keep}


def test_no_module_level_import_cycle_in_sgl():
    assert cycles(import_graph(SGL, lazy=False)) == []


def test_model_and_text_modules_import_acyclically_even_in_functions():
    graph = _induced(import_graph(SGL, lazy=True), ACYCLIC_EVEN_LAZILY)
    assert "sgl.runtime.model.cpu_packed" in graph and "sgl.runtime.detokenizer" in graph
    assert cycles(graph) == []
    # The inversions that keep it so: the packing pass knows no layer kind, and the VNNI layers
    # share the quantized tensor and the route with quant.py instead of importing it.
    assert not graph["sgl.runtime.model.cpu_packed"] & {
        "sgl.runtime.model.llama",
        "sgl.runtime.model.moe",
    }
    assert "sgl.runtime.model.quant" not in graph["sgl.runtime.model.quant_vnni"]


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A package `pkg` whose a.py and b.py import each other: b at module level, a in a
    function; c.py imports a only under TYPE_CHECKING; d.py imports a relatively."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from pkg import b\n")
    (root / "b.py").write_text("def f():\n    from pkg.a import thing\n")
    (root / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    )
    (root / "d.py").write_text("from . import a\nfrom .a import x\n")
    return root


def test_the_graph_sees_a_cycle_through_a_function_level_import(package):
    assert cycles(import_graph(package, lazy=False)) == []
    lazy = import_graph(package, lazy=True)
    assert cycles(lazy) == [["pkg.a", "pkg.b"]]
    assert lazy["pkg.c"] == set() and lazy["pkg.d"] == {"pkg.a"}
    (package / "c.py").write_text("from pkg import d\n")
    (package / "a.py").write_text("import pkg.c\n")
    assert cycles(import_graph(package, lazy=False)) == [["pkg.a", "pkg.c", "pkg.d"]]
