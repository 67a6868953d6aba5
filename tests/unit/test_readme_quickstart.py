"""The README's quickstart is what ``onceflow new payments`` writes and prints: each file it
shows equals the generated one and its commands are the printed ones, so README and
templates cannot drift; the generated project loads (its test passes, its config's keys are
known, its pipeline resolves). The refusals of ``onceflow new`` are here too."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from onceflow.runtime import cli, new_project
from onceflow.runtime.config import load_settings
from onceflow.runtime.wiring import load_pipeline
from onceflow.stages import Pipeline

README = Path(__file__).parents[2] / "README.md"
NAME = "payments"


@pytest.fixture(autouse=True)
def own_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``onceflow`` puts its current directory on sys.path: each test's stays its own."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


def shown_files() -> dict[str, str]:
    """README path -> content, for the blocks that open with ``# PATH: ...``."""
    shown = {}
    for block in blocks("python") + blocks("hocon"):
        path = re.match(r"# ([\w./]+):", block)
        assert path, f"a quickstart block does not name its file:\n{block[:200]}"
        shown[path.group(1)] = block
    return shown


def test_the_readme_shows_what_onceflow_new_writes_and_prints() -> None:
    written = new_project.render(NAME)
    shown = shown_files()
    assert set(shown) == {f"{NAME}/pipeline.py", "tests/test_pipeline.py", f"{NAME}.conf"}
    for path, content in shown.items():
        assert content == written[path], f"README's {path} differs from `onceflow new`'s"
    readme = README.read_text()
    assert f"    onceflow new {NAME}\n" in readme
    for path in set(written) - set(shown):  # the rest is named
        assert f"`{path}`" in readme, path
    assert blocks("sh") == [new_project.next_steps(NAME)]


def test_the_generated_project_tests_green_and_its_config_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", NAME]) == 0
    project = tmp_path / NAME
    sys.path.insert(0, str(project))  # what `python -m pytest` in it does (own_sys_path)
    for module in (NAME, f"{NAME}.pipeline"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    namespace: dict[str, object] = {}
    exec((project / "tests" / "test_pipeline.py").read_text(), namespace)
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()  # type: ignore[operator]

    monkeypatch.delenv("ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    settings = load_settings(project / f"{NAME}.conf", {})
    assert isinstance(load_pipeline(settings), Pipeline)
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"  # onceflow services up's
    scripts = (project / "create_topics.py").read_text()
    assert repr((NAME, settings.kafka.dead_letter_topic)).replace("'", '"') in scripts
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS", "elsewhere:9093")
    monkeypatch.setenv("ONCEFLOW_REDIS_URL", "redis://elsewhere:6380/1")
    moved = load_settings(project / f"{NAME}.conf", {})
    assert (moved.kafka.bootstrap_servers, moved.stores.redis.url) == (
        "elsewhere:9093", "redis://elsewhere:6380/1")


@pytest.mark.parametrize(("name", "reason"), [
    ("pay-ments", "is not a Python package name"),
    ("1st", "is not a Python package name"),
    ("zahlungsverkehr_ü", "is not a Python package name"),
    ("", "is not a Python package name"),
    ("class", "is a Python keyword"),
    ("json", "would shadow the module"),
    ("onceflow", "would shadow the module"),
    ("tests", "would shadow the module"),
    ("pytest", "is already an installed module"),
])
def test_a_name_that_is_no_fitting_package_is_refused_with_exit_2(
        name: str, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", name]) == 2
    assert reason in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_refused_unless_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / NAME).mkdir()
    (tmp_path / NAME / "notes.txt").write_text("mine")
    assert cli.main(["new", NAME]) == 2
    assert "exists and is not empty: nothing written" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / NAME).iterdir()] == ["notes.txt"]

    (tmp_path / "shop").write_text("a file")
    assert cli.main(["new", "shop"]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err

    (tmp_path / "empty").mkdir()
    assert cli.main(["new", "empty"]) == 0
    assert (tmp_path / "empty" / "empty" / "pipeline.py").is_file()
    assert "python -m pytest tests" in capsys.readouterr().out
