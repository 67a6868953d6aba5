"""reference.conf's parse cache: the cached tree gives the same settings as a fresh parse,
an edited file is parsed again, a broken cache file is ignored, and nothing is written
where Python writes no bytecode."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from pyhocon import ConfigFactory, ConfigTree

from onceflow.runtime import config, parsed_reference
from onceflow.runtime.parsed_reference import REFERENCE, parse_reference

DEMO = Path(config.__file__).parents[1] / "examples" / "demo.conf"


@pytest.fixture
def reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    copy = tmp_path / "reference.conf"
    shutil.copy(REFERENCE, copy)
    return copy


def cache_files(reference: Path) -> list[Path]:
    return sorted((reference.parent / "__pycache__").glob("reference.conf.*.pickle"))


def settings_with(tree: ConfigTree, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    monkeypatch.setattr(config, "_parsed_reference", lambda: tree)
    return config.load_settings(str(DEMO))


def test_the_cached_tree_gives_the_settings_of_a_fresh_parse(
        reference: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_KAFKA_GROUP_ID", "from-the-environment")  # a ${?VAR}
    first = parse_reference(reference)
    assert len(cache_files(reference)) == 1
    cached = parse_reference(reference)
    assert cached is not first  # read back from the file
    fresh = ConfigFactory.parse_string(REFERENCE.read_text("utf-8"), resolve=False)
    expected = settings_with(fresh, monkeypatch)
    assert expected.kafka.group_id == "from-the-environment"
    assert settings_with(cached, monkeypatch) == expected


def test_an_edited_file_is_parsed_again(reference: Path) -> None:
    parse_reference(reference)
    reference.write_text(reference.read_text("utf-8") + "\nextra { added = 7 }\n", "utf-8")
    assert parse_reference(reference).get("extra.added") == 7
    assert len(cache_files(reference)) == 2  # one per text


def test_a_broken_cache_file_is_parsed_over(reference: Path) -> None:
    parse_reference(reference)
    [cached] = cache_files(reference)
    cached.write_bytes(b"\x80\x05 not a whole pickle")
    assert parse_reference(reference).get("onceflow.single-worker") is False
    assert parse_reference(reference).get("onceflow.single-worker") is False  # rewritten


def test_no_cache_is_written_where_python_writes_no_bytecode(
        reference: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert parse_reference(reference).get("onceflow.single-worker") is False
    assert cache_files(reference) == []


def test_a_pycache_prefix_holds_the_cache(
        reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    parse_reference(reference)
    assert cache_files(reference) == []
    assert len(list((tmp_path / "prefix").rglob("reference.conf.*.pickle"))) == 1
    assert parsed_reference._cache_file(reference, "x").is_relative_to(tmp_path / "prefix")
