"""Import cycles: the modules of ``python/reprise`` form a DAG, found statically.

Only imports that run when a module is imported count: those at module level,
including under ``if``/``try``/``with`` and ``if TYPE_CHECKING:`` (a cycle there is
still a layering cycle), and not those inside functions. ``from .a import b`` is
an edge to ``a.b`` when that is a module, and to ``a`` in any case. Importing
``p.q`` also runs ``p/__init__``, so it is an edge to every package above ``q``,
except the importer's own packages (always initialised before it runs).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent / "python" / "reprise"


def modules(root: Path) -> dict[str, Path]:
    """``{dotted name: file}`` of every ``.py`` under the package directory ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def module_level_imports(tree: ast.Module):
    """The ``Import``/``ImportFrom`` nodes that run at import time (not inside a function)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: the modules of root's package it imports at module level}``."""
    known = modules(root)
    graph = {}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1 + is_package)}
        targets = set()
        for node in module_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = name.split(".")
            if node.level:  # relative: up from the importer's package
                base = base[:len(base) - node.level + is_package]
            base = ".".join(base + ([node.module] if node.module else []))
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
        above = {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 1)}
        graph[name] = {t for t in targets | above if t in known and t not in own and t != name}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return e.args[1]
    return None


def test_reprise_modules_import_each_other_without_cycles():
    graph = import_graph(SOURCE)
    assert len(graph) > 50 and "reprise.distributed.table" in graph["reprise.distributed"]
    cycle = cycle_in(graph)
    assert cycle is None, ("import cycle: " + " -> ".join(cycle) + "; put what both sides need in a module of its "
                           "own that both import (one concept, named for it)")


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


@pytest.mark.parametrize("files", [
    {"pkg/__init__.py": "", "pkg/a.py": "from .b import x\n", "pkg/b.py": "from . import a\nx = 1\n"},
    {"pkg/__init__.py": "", "pkg/a.py": "import pkg.sub.b\n",
     "pkg/sub/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import y\n",
     "pkg/sub/b.py": ""},
    # Outside pkg/sub, importing pkg.sub.b runs pkg/sub/__init__, which imports the importer.
    {"pkg/__init__.py": "", "pkg/a.py": "from .sub.b import x\n",
     "pkg/sub/__init__.py": "from .c import z\n", "pkg/sub/b.py": "x = 1\n", "pkg/sub/c.py": "from ..a import x\n"},
], ids=["relative", "type-checking-and-absolute", "through-a-package-init"])
def test_the_check_finds_cycles(tmp_path, files):
    assert cycle_in(import_graph(write(tmp_path, files))) is not None


def test_the_check_ignores_function_level_imports_and_a_package_importing_its_own_modules(tmp_path):
    root = write(tmp_path, {
        "pkg/__init__.py": "from .a import f\nfrom .b import g\n",
        "pkg/a.py": "from . import b\n\ndef f():\n    from . import c\n",
        "pkg/b.py": "import pkg.c\ndef g(): pass\n",
        "pkg/c.py": "def h():\n    from .a import f\n"})
    graph = import_graph(root)
    assert graph == {"pkg": {"pkg.a", "pkg.b"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": set()}
    assert cycle_in(graph) is None
