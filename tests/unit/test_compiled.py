"""The compiled record path: a build older than its sources is refused at import."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from onceflow import compiled


def stand_in(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for ``onceflow/stages`` under ``root``: two sources, compiled or not."""
    stages = root / "onceflow" / "stages"
    stages.mkdir(parents=True)
    monkeypatch.setattr(compiled, "HERE", stages)
    monkeypatch.setattr(compiled, "MANIFEST", stages / "_compiled.json")
    monkeypatch.setattr(compiled, "MODULES", ("runner", "windows"))
    for module in ("runner", "windows"):
        (stages / f"{module}.py").write_text(f"# {module}\n")
    return stages


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """In a checkout (beside ``pyproject.toml``)."""
    (tmp_path / "pyproject.toml").write_text("")
    return stand_in(tmp_path, monkeypatch)


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """In ``site-packages``, from a wheel."""
    return stand_in(tmp_path / "site-packages", monkeypatch)


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


def test_an_installed_build_edited_after_the_install_names_the_reinstall(
    installed: Path,
) -> None:
    build(installed)
    compiled.check()
    (installed / "runner.py").write_text("# runner, edited in site-packages\n")
    with pytest.raises(compiled.StaleBuild, match=r"\(runner\.py changed\).*install onceflow"):
        compiled.check()


def test_a_build_writes_the_manifest_check_reads(package: Path) -> None:
    for module in ("runner", "windows"):
        (package / f"{module}.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    compiled.write_manifest(package)
    compiled.check()
    (package / "runner.py").write_text("# runner, edited\n")
    with pytest.raises(compiled.StaleBuild, match=r"\(runner\.py changed\)"):
        compiled.check()


def test_a_build_compiles_unless_told_or_unable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pure where it cannot compile: a wheel, not a failed install."""
    monkeypatch.delenv(compiled.PURE, raising=False)
    monkeypatch.delenv("CC", raising=False)
    assert compiled.why_pure() is None  # this environment has gcc, Python.h and mypyc
    monkeypatch.setenv(compiled.PURE, "1")
    assert compiled.why_pure() == "ONCEFLOW_PURE=1"
    monkeypatch.setenv(compiled.PURE, "0")
    monkeypatch.setenv("CC", "no-such-cc -pthread")
    assert compiled.why_pure() == "no C compiler (no-such-cc)"
    monkeypatch.delenv("CC")
    monkeypatch.setitem(sys.modules, "mypyc.build", None)  # import fails
    assert compiled.why_pure() == "mypyc (part of mypy) is not installed"


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
