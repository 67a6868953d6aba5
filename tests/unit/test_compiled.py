"""The compiled record path: a build older than its sources is refused at import."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from onceflow import compiled


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for ``onceflow/stages``: two sources, compiled or not."""
    monkeypatch.setattr(compiled, "HERE", tmp_path)
    monkeypatch.setattr(compiled, "MANIFEST", tmp_path / "_compiled.json")
    monkeypatch.setattr(compiled, "MODULES", ("runner", "windows"))
    for module in ("runner", "windows"):
        (tmp_path / f"{module}.py").write_text(f"# {module}\n")
    return tmp_path


def build(package: Path) -> None:
    for module in ("runner", "windows"):
        (package / f"{module}.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    compiled.MANIFEST.write_text(json.dumps({m: compiled._digest(m) for m in compiled.MODULES}))


def test_pure_python_needs_no_build(package: Path) -> None:
    compiled.check()


def test_a_current_build_passes(package: Path) -> None:
    build(package)
    compiled.check()


def test_a_source_edited_after_the_build_is_refused_naming_it(package: Path) -> None:
    build(package)
    (package / "windows.py").write_text("# windows, edited\n")
    with pytest.raises(compiled.StaleBuild, match=r"\(windows\.py changed\).*make setup"):
        compiled.check()


def test_a_build_without_its_manifest_is_refused(package: Path) -> None:
    build(package)
    compiled.MANIFEST.unlink()
    with pytest.raises(compiled.StaleBuild, match="without their manifest"):
        compiled.check()


def test_remove_goes_back_to_pure_python(package: Path) -> None:
    build(package)
    compiled.remove()
    assert compiled.built() == [] and not compiled.MANIFEST.exists()
    compiled.check()


def test_a_build_here_compiles_every_listed_module_and_nothing_else() -> None:
    """Whatever `make` left here is whole: every listed module compiled, or none."""
    extensions = {path.name.split(".")[0] for path in compiled.built()}
    if extensions:
        assert extensions == {*compiled.MODULES, "_compiled__mypyc"}
    loaded = {m: Path(importlib.import_module(f"onceflow.stages.{m}").__file__ or "").suffix
              for m in compiled.MODULES}
    assert set(loaded.values()) == ({".so"} if extensions else {".py"}), loaded
