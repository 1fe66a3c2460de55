"""The package's import graph has no cycle, and every module imports in a fresh interpreter.

The graph is read from the source with ``ast``: an edge ``a -> b`` for every ``import`` of an ``ssm_fairseq`` module
``b`` anywhere in ``a`` (at the top or inside a function: an import deferred to break a cycle is still a cycle in
the design; only ``if TYPE_CHECKING:`` blocks, which never run, are left out). ``from X import name`` is an edge to
``X.name`` when that is a module, else to ``X``. Importing a module also runs the ``__init__`` of the packages above
it, so an edge to ``a.b.c`` is one to ``a`` and ``a.b`` too, except to the importer's own packages (those run
before it).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from cli import REPO

PACKAGE = REPO / "ssm_fairseq"


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its ``__init__.py``)."""
    names = {}
    for file in sorted(package.rglob("*.py")):
        parts = file.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return names


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
              modules: dict[str, Path]) -> set[str]:
    """The package's modules an import statement in ``module`` names: ``import X`` -> X; ``from X import a`` ->
    ``X.a`` where that is a module, else X."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules.keys()
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    submodules = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
    return submodules or ({base} & modules.keys())


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth, but for those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            yield from _imports(node)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see the module docstring for what counts)."""
    modules = module_names(package)
    graph = {}
    for name, file in modules.items():
        edges = set()
        for node in _imports(ast.parse(file.read_text(), str(file))):
            edges |= _imported(node, name, file.name == "__init__.py", modules)
        graph[name] = {package for edge in edges for package in _with_packages(edge)} - set(_with_packages(name))
    return graph


def _with_packages(module: str) -> list[str]:
    """``module`` and the packages above it: importing ``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every cycle lies in one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_the_package_modules():
    graph = import_graph()
    assert len(graph) > 50 and "ssm_fairseq.asr.stream" in graph["ssm_fairseq.asr.recognizer"]
    found = cycles(graph)
    edges = [f"{module} -> {sorted(graph[module] & set(cycle))}" for cycle in found for module in cycle]
    assert found == [], "import cycles (each module -> the modules of its cycle it imports):\n" + "\n".join(edges)


def test_the_cycle_check_finds_a_cycle_through_a_deferred_import(tmp_path):
    """Two modules importing each other, one of them inside a function (as transcribe.py and
    asr/streaming_transcriber.py did), and a relative ``from .. import module``: found; an import for type checkers
    only is no edge, an import of ``pkg.sub.b`` is one to ``pkg.sub`` too."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def main():\n    from .sub.b import f\n")
    (package / "sub" / "b.py").write_text("from .. import a\nf = 1\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nfrom pkg.a import main\n"
                                  "if TYPE_CHECKING:\n    from .sub import b\n")
    assert import_graph(package) == {"pkg": set(), "pkg.sub": set(), "pkg.a": {"pkg.sub", "pkg.sub.b"},
                                     "pkg.sub.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.sub.b"]]


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(module_names())
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    result = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
