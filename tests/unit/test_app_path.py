"""The user's pipeline module is found from the current directory or --app-dir (issue 31),
with the console script as users run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.runtime.app_path import take_app_dir

ONCEFLOW = Path(sys.executable).with_name("onceflow")  # the console script of this venv
CONFIG = 'onceflow {{ pipeline = "{module}:pipeline" }}\n'
# Importing it proves it was found; it then fails on purpose, so the command stops at once.
MODULE = "from pathlib import Path\nPath('imported').write_text('yes')\nraise RuntimeError('x')\n"


def project(root: Path, module: str = "payapp") -> Path:
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text("")
    (root / module / "pipeline.py").write_text(MODULE)
    conf = root / "app.conf"
    conf.write_text(CONFIG.format(module=f"{module}.pipeline"))
    return conf


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ONCEFLOW), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_module_is_imported_from_the_current_directory(tmp_path: Path) -> None:
    conf = project(tmp_path)
    done = run(["run", "-c", str(conf)], tmp_path)
    assert done.returncode == 2, done.stderr
    assert (tmp_path / "imported").read_text() == "yes"  # found and imported
    assert "RuntimeError: x" in done.stderr


def test_app_dir_chooses_another_directory(tmp_path: Path) -> None:
    conf = project(tmp_path / "proj")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run(["run", "--app-dir", str(tmp_path / "proj"), "-c", str(conf)], elsewhere)
    assert done.returncode == 2, done.stderr
    assert "RuntimeError: x" in done.stderr  # imported (its cwd is elsewhere: no marker file)


def test_a_module_not_found_names_where_it_looked_and_the_fix(tmp_path: Path) -> None:
    conf = project(tmp_path / "proj")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run(["run", "-c", str(conf)], elsewhere)
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert "onceflow.pipeline" in line and "No module named 'payapp'" in line, line
    assert f"looked in {elsewhere.resolve()} (the app directory)" in line, line
    assert "--app-dir DIR" in line and "holds payapp" in line, line


@pytest.mark.parametrize(("argv", "rest", "chosen"), [
    (["run", "-c", "a.conf"], ["run", "-c", "a.conf"], None),
    (["run", "--app-dir", "D", "-c", "a.conf"], ["run", "-c", "a.conf"], "D"),
    (["--app-dir=D", "states", "-c", "a.conf"], ["states", "-c", "a.conf"], "D"),
])
def test_app_dir_is_taken_from_anywhere_in_the_arguments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], rest: list[str],
        chosen: str | None) -> None:
    (tmp_path / "D").mkdir()
    monkeypatch.chdir(tmp_path)
    got_rest, directory = take_app_dir(argv)
    assert got_rest == rest
    assert directory == (tmp_path / chosen if chosen else tmp_path).resolve()


def test_app_dir_must_name_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expects a directory"):
        take_app_dir(["run", "--app-dir"])
    with pytest.raises(ValueError, match="expected a directory"):
        take_app_dir(["run", "--app-dir", str(tmp_path / "absent")])
