"""The docs point at things that exist: every relative link in README.md, docs/**/*.md and
the benchmarks' current figures (RESULTS.md and the journal's index) reaches a file (and a
heading, when it names one), and every file path or `onceflow.x.y` name they cite in
backticks is a file, a module with that attribute, a config key of reference.conf or a
documented header. A page moved or a module renamed fails here."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pyhocon import ConfigFactory, ConfigTree

ROOT = Path(__file__).parents[2]
JOURNAL = ROOT / "benchmarks" / "journal"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"),
                ROOT / "benchmarks" / "RESULTS.md", JOURNAL / "README.md"])

# Record headers onceflow writes (`onceflow.reason` ...): names, not modules or keys.
HEADERS = {"reason", "source", "stage", "pipeline", "index", "root", "position", "truncated",
           "generation"}
# Names the docs cite on purpose although they do not exist.
NOT_REAL = {"onceflow.kafka.sesion-timeout"}  # the misspelt key of an error message's example
# Where cited paths live; anything else in backticks with a slash is prose (`<dir>/...`).
TOP_DIRS = ("onceflow/", "tests/", "benchmarks/", "scripts/", "config/", "docs/", "deploy/")

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
_SPAN = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_PATH = re.compile(r"(?<![\w./<-])((?:onceflow|tests|benchmarks|scripts|config|docs|deploy)/"
                   r"[\w./-]*\w\.(?:py|pyi|md|conf|proto|yml|yaml|json|sh|toml))\b")
_NAME = re.compile(r"(?<![\w./<:-])(onceflow(?:\.[A-Za-z_][\w-]*)+(?::\w+)?)")


def prose(text: str) -> str:
    """The page without fenced blocks and code spans (links there are examples)."""
    return _SPAN.sub("", _FENCE.sub("", text))


def spans(text: str) -> list[str]:
    """The code spans of a page, outside fenced blocks."""
    return _SPAN.findall(_FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _FENCE.sub("", page.read_text()), re.M):
        base, n = slug(heading), 0
        while (name := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(name)
    return found


def relative(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_relative_links_reach_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in _LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{relative(page)}: " + "; ".join(broken)


@cache
def config_paths() -> set[str]:
    """Every key and object path of reference.conf (`onceflow.kafka`, `...kafka.ssl.ca-file`)."""
    found: set[str] = set()

    def walk(tree: ConfigTree, prefix: str) -> None:
        for name, value in tree.items():
            found.add(prefix + name)
            if isinstance(value, ConfigTree):
                walk(value, f"{prefix}{name}.")

    tree: Any = ConfigFactory.parse_file(str(ROOT / "onceflow/runtime/reference.conf"),
                                         resolve=False)
    walk(tree, "")
    return found


@cache
def defined(module: Path) -> set[str]:
    """The names a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def name_exists(name: str) -> bool:
    """A module (with the attribute after it), a config key, or a header onceflow writes."""
    if name in NOT_REAL:
        return True
    dotted, _, attribute = name.partition(":")
    if dotted in config_paths():
        return True
    parts = dotted.split(".")
    if len(parts) == 2 and parts[1] in HEADERS:
        return True
    for cut in range(len(parts), 0, -1):  # the longest prefix that is a module
        module = module_file(parts[:cut])
        if module is None:
            continue
        rest = parts[cut:] + ([attribute] if attribute else [])
        return not rest or rest[0] in defined(module)
    return False


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_cited_files_and_modules_exist(page: Path) -> None:
    cited = spans(page.read_text())
    missing = sorted({path for span in cited for path in _PATH.findall(span)
                      if not (ROOT / path).exists()}
                     | {name for span in cited for name in _NAME.findall(span)
                        if not name_exists(name)})
    assert not missing, f"{relative(page)} cites what does not exist: {missing}"


def test_journal_index_links_every_page() -> None:
    """A day's page the benchmarks started is listed in the journal's index."""
    listed = set(_LINK.findall(prose((JOURNAL / "README.md").read_text())))
    pages = {page.name for page in JOURNAL.glob("*.md") if page.name != "README.md"}
    assert pages, "no journal pages"
    assert pages <= listed, f"not in benchmarks/journal/README.md: {sorted(pages - listed)}"
