"""docs/guide/configuration.md is what scripts/config_reference.py writes from reference.conf,
with every key the worker knows, so the reference cannot go stale unnoticed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pyhocon import ConfigFactory, ConfigTree

ROOT = Path(__file__).parents[2]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_reference",
                                                  ROOT / "scripts" / "config_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def leaves(tree: ConfigTree, prefix: str = "") -> set[str]:
    found: set[str] = set()
    for name, value in tree.items():
        path = f"{prefix}{name}"
        found |= leaves(value, path + ".") if isinstance(value, ConfigTree) else {path}
    return found


def test_the_committed_reference_is_current() -> None:
    script = load_script()
    page = script.render(script.SOURCE.read_text())
    assert script.TARGET.read_text() == page, (
        f"{script.TARGET.relative_to(ROOT)} is stale: run `{script.COMMAND}`")


def test_every_key_has_a_type_a_default_and_a_why() -> None:
    script = load_script()
    _, sections = script.parse(script.SOURCE.read_text())
    keys = [key for section in sections for key in section.keys]
    tree: Any = ConfigFactory.parse_file(str(script.SOURCE), resolve=False)
    assert sorted(key.path for key in keys) == sorted(leaves(tree))
    for key in keys:
        assert key.default and key.why, key
        assert script.kind(key)


def test_a_stale_page_fails_the_check_with_the_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script()
    source = tmp_path / "reference.conf"
    source.write_text(script.SOURCE.read_text().replace(
        "\n  kafka {",
        "\n  # A key added without regenerating the page.\n  new-key = 1s\n\n  kafka {"))
    monkeypatch.setattr(script, "SOURCE", source)
    monkeypatch.setattr(script, "TARGET", tmp_path / "configuration.md")
    monkeypatch.setattr(script, "ROOT", tmp_path)
    script.TARGET.write_text((ROOT / "docs" / "guide" / "configuration.md").read_text())
    assert script.main(["config_reference.py", "--check"]) == 1
    assert "run `python scripts/config_reference.py`" in capsys.readouterr().err
    assert script.main(["config_reference.py"]) == 0
    assert "| `new-key` | duration | `1s` |  | A key added without regenerating the page. |" in (
        script.TARGET.read_text())
    assert script.main(["config_reference.py", "--check"]) == 0
