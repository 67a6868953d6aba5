"""No import circles inside onceflow: each module sits above the ones it imports.

A circle makes a module's import order matter (a name read while its module is
half-initialised fails, or works only from one entry point) and means two
concepts are not apart. The mend is a lower module both sides import (shared
types, messages, small protocols), never an import hidden in a function.

What is counted: imports at a module's top level (inside ``if``/``try``/class
bodies too, not inside functions: those are lazy loads of optional extras and
of CLI subcommands, which run after every module is imported). The first test
counts runtime imports only and leaves out ``if TYPE_CHECKING:`` blocks; the
second counts those too, since a circle through type hints is the same
tangle of concepts. ``from package import name`` counts as importing the
submodule ``package.name`` when there is one, else the package itself.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import onceflow

ROOT = Path(onceflow.__file__).parent.parent


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (found under ``root``) by dotted name."""
    found = {}
    for path in (root / package.replace(".", "/")).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def top_level_imports(tree: ast.Module, type_checking: bool) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when imported (and, with ``type_checking``, those mypy
    reads under ``if TYPE_CHECKING:``); never those inside functions."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(node)
            elif isinstance(node, ast.If) and _type_checking(node):
                if type_checking:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.If | ast.While | ast.For | ast.With | ast.ClassDef):
                visit(node.body)
                visit(getattr(node, "orelse", []))
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return found


def import_graph(root: Path, package: str, type_checking: bool) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports."""
    known = modules(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in top_level_imports(ast.parse(path.read_text()), type_checking):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name in known}
                continue
            base = node.module or ""
            if node.level:
                base = ".".join([*here[:len(here) - node.level + 1], *filter(None, [base])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    targets.add(sub)
                elif base in known:
                    targets.add(base)
        graph[name] = targets - {name}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (first module repeated at the end), or None."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        return list(error.args[1])
    return None


def test_onceflow_has_no_runtime_import_circle() -> None:
    graph = import_graph(ROOT, "onceflow", type_checking=False)
    assert len(graph) > 100 and "onceflow.actors.consumer" in graph  # the scan sees it all
    found = circle(graph)
    assert found is None, f"import circle: {' -> '.join(found)}"


def test_onceflow_has_no_import_circle_through_type_hints_either() -> None:
    found = circle(import_graph(ROOT, "onceflow", type_checking=True))
    assert found is None, f"import circle: {' -> '.join(found)}"


@pytest.mark.parametrize(
    ("a_source", "type_checking", "found"),
    [
        ("from pkg import b\n", False, ["pkg.a", "pkg.b", "pkg.a"]),
        ("from .b import LATER\n", False, ["pkg.a", "pkg.b", "pkg.a"]),
        ("import pkg.b\n", False, ["pkg.a", "pkg.b", "pkg.a"]),
        ("class A:\n    from pkg.b import LATER\n", False, ["pkg.a", "pkg.b", "pkg.a"]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import LATER\n",
         True, ["pkg.a", "pkg.b", "pkg.a"]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import LATER\n",
         False, None),
        ("def f():\n    from pkg.b import LATER\n", True, None),
        ("from pkg.c import C\n", True, None),
    ],
)
def test_the_scan_finds_a_circle_where_there_is_one(
    tmp_path: Path, a_source: str, type_checking: bool, found: list[str] | None
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(a_source)
    (package / "b.py").write_text("from pkg.a import A\nLATER = 1\n")
    (package / "c.py").write_text("C = 1\n")
    result = circle(import_graph(tmp_path, "pkg", type_checking))
    if found is None:
        assert result is None
    else:  # the same circle, whichever module it starts from
        assert result is not None and sorted(result[:-1]) == sorted(found[:-1])
        assert result[0] == result[-1]
