"""The README's quickstart as a newcomer copies it: its pipeline module, its `TestRun` test and
its config load together (the config's keys are all known, its pipeline resolves), so the
README's first steps cannot drift from the API."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from onceflow.runtime.config import load_settings
from onceflow.runtime.wiring import load_pipeline
from onceflow.stages import Pipeline

README = Path(__file__).parents[2] / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


def test_the_quickstart_pipeline_test_and_config_work(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    module, test, *_ = blocks("python")
    assert module.startswith("# payapp/pipeline.py")
    (tmp_path / "payapp").mkdir()
    (tmp_path / "payapp" / "__init__.py").write_text("")
    (tmp_path / "payapp" / "pipeline.py").write_text(module)
    (tmp_path / "app.conf").write_text(blocks("hocon")[0])
    monkeypatch.syspath_prepend(str(tmp_path))  # what the README's PYTHONPATH does
    monkeypatch.delitem(sys.modules, "payapp", raising=False)
    monkeypatch.delitem(sys.modules, "payapp.pipeline", raising=False)

    namespace: dict[str, object] = {}
    exec(test, namespace)
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()  # type: ignore[operator]

    settings = load_settings(tmp_path / "app.conf", {})
    assert isinstance(load_pipeline(settings), Pipeline)
    assert settings.kafka.dead_letter_topic in blocks("python")[2]  # the topics it creates
