"""The design doc and the current figures name classes that exist: every CamelCase name
cited in backticks in docs/architecture.md and benchmarks/RESULTS.md (`Lane`,
`delivery.Lane`, `Lanes.adopt`) is a class, function or name defined in onceflow/ (or a
message of its .proto files), in the module it is cited with, with the attribute it is
cited with. A class renamed in the code and not in the docs fails here (dotted
`onceflow.x.y` names and file paths are test_doc_links's). And RESULTS.md's table has a
row for every script in benchmarks/, so a new benchmark is not left out of it."""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest
from test_doc_links import defined

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "onceflow"
PAGES = [ROOT / "docs" / "architecture.md", ROOT / "benchmarks" / "RESULTS.md"]

# Concepts the docs write in CamelCase although no class has the name, each with why.
CONCEPTS: dict[str, str] = {
    "SerializeToString": "protobuf's own method, which unit_wire's writer is pinned to",
}

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
_SPAN = re.compile(r"`([^`]+)`")
# An optional module path (`delivery.`, `kafka/continuity.`), a CamelCase name (a capital
# first, a lower-case letter somewhere: not SIGTERM or MSET), optional attributes.
_CITED = re.compile(r"(?<![\w.$-])((?:[a-z_]\w*[./])*)([A-Z]\w*[a-z]\w*)((?:\.\w+)*)")


@cache
def modules() -> dict[str, list[Path]]:
    """onceflow's modules by their last name (`delivery`, and `stages` for a package)."""
    found: dict[str, list[Path]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = path.parent.name if path.name == "__init__.py" else path.stem
        found.setdefault(name, []).append(path)
    return found


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def members(path: Path, cls: str) -> set[str] | None:
    """What class ``cls`` of a module defines (methods, class attributes, `self.x = ...`),
    or None when the module has no such class (a name imported or assigned)."""
    for node in tree(path).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            names: set[str] = set()
            for inner in ast.walk(node):
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(inner.name)
                elif isinstance(inner, ast.Name | ast.Attribute) and isinstance(
                        inner.ctx, ast.Store):
                    names.add(inner.id if isinstance(inner, ast.Name) else inner.attr)
            return names
    return None


@cache
def definers() -> dict[str, list[Path]]:
    """The modules that define or import each top-level name."""
    found: dict[str, list[Path]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in defined(path):
            found.setdefault(name, []).append(path)
    return found


@cache
def proto_messages() -> set[str]:
    return {name for proto in PACKAGE.rglob("*.proto")
            for name in re.findall(r"^\s*message\s+(\w+)", proto.read_text(), re.M)}


def problem(prefix: str, name: str, attributes: str) -> str | None:
    """Why a cited ``prefix``+``name``+``attributes`` does not exist, or None."""
    if name in CONCEPTS or hasattr(builtins, name):
        return None
    module = re.split(r"[./]", prefix.rstrip("./"))[-1] if prefix else ""
    if module and module not in modules():
        if importlib.util.find_spec(module.split(".")[0]) is not None:
            return None  # another library's class (`asyncio.Lock`)
        return f"no module {module!r} in onceflow/"
    holders = [path for path in definers().get(name, [])
               if not module or path in modules()[module]]
    if not holders:
        if not module and name in proto_messages():
            return None
        return f"{module + '.' if module else ''}{name} is not defined in onceflow/"
    attribute = attributes.lstrip(".").split(".")[0]
    if not attribute:
        return None
    classes = [names for path in holders if (names := members(path, name)) is not None]
    if not classes or any(attribute in names for names in classes):
        return None  # no class of that name (an import or alias), or one with the attribute
    return f"{name} has no {attribute!r}"


def cited(page: Path) -> list[tuple[str, str, str]]:
    """Every (module prefix, CamelCase name, attributes) cited in a code span of a page."""
    return [match for span in _SPAN.findall(_FENCE.sub("", page.read_text()))
            for match in _CITED.findall(span)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_cited_class_names_exist(page: Path) -> None:
    missing = sorted({f"`{''.join(found)}`: {why}" for found in cited(page)
                      if (why := problem(*found))})
    assert not missing, f"{page.relative_to(ROOT)} names what the code does not have: {missing}"


def test_concepts_are_not_classes_after_all() -> None:
    """An allow-listed concept that became a class should be checked like one."""
    assert not set(definers()) & set(CONCEPTS)


def test_results_table_has_a_row_per_script() -> None:
    rows = re.findall(r"^\| `(\w+\.py)`", (ROOT / "benchmarks" / "RESULTS.md").read_text(), re.M)
    scripts = {path.name for path in (ROOT / "benchmarks").glob("*.py")}
    assert scripts <= set(rows), f"no row in benchmarks/RESULTS.md: {sorted(scripts - set(rows))}"
