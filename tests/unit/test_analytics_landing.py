"""The landing zone writer and the readers' pure parts: no services, no Spark."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from onceflow.analytics.cli import parse_time
from onceflow.analytics.landing import LandingZone, file_name, read_landing
from onceflow.analytics.readers import (
    MAX_TOKEN,
    MIN_TOKEN,
    RedisSource,
    decode_row,
    redis_shard_patterns,
    token_ranges,
)
from onceflow.stages.state import AggregateState, encode_state

WINDOWS = {("robot-1", 60_000): b'{"ok":3,"failed":1}', ("robot-2", 0): b'{"ok":1,"failed":0}'}
OFFSETS = {("topic", 0): 120, ("topic", 1): 80}


def test_a_flush_becomes_one_parquet_file_with_its_offsets(tmp_path: Path) -> None:
    path = LandingZone(tmp_path, "robots").write("per_robot_minute", WINDOWS, OFFSETS)
    assert path is not None
    assert path.parent == tmp_path / "stage=per_robot_minute"
    assert path.name.startswith("robots-per_robot_minute-w0-")
    table = pq.read_table(path)
    assert table.to_pylist() == [
        {"pipeline": "robots", "key": "robot-2", "window_start": 0,
         "value": '{"ok":1,"failed":0}'},
        {"pipeline": "robots", "key": "robot-1", "window_start": 60_000,
         "value": '{"ok":3,"failed":1}'},
    ]
    assert json.loads(table.schema.metadata[b"onceflow.offsets"]) == {"topic:0": 120,
                                                                      "topic:1": 80}
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_writing_the_same_windows_again_replaces_the_file(tmp_path: Path) -> None:
    zone = LandingZone(tmp_path, "robots")
    first = zone.write("per_robot_minute", WINDOWS, OFFSETS)
    again = zone.write("per_robot_minute", dict(reversed(WINDOWS.items())), {("topic", 0): 7})
    assert first == again
    assert len(read_landing(tmp_path)) == 2
    assert zone.write("per_robot_minute", {}, OFFSETS) is None


def test_the_name_depends_on_stage_and_windows_only() -> None:
    other = {**WINDOWS, ("robot-3", 0): b"{}"}
    assert file_name("p", "s", WINDOWS) == file_name("p", "s", dict(reversed(WINDOWS.items())))
    assert file_name("p", "s", WINDOWS) != file_name("p", "s", other)
    assert file_name("p", "s", WINDOWS) != file_name("p", "t", WINDOWS)


def test_readers_skip_temp_files(tmp_path: Path) -> None:
    path = LandingZone(tmp_path, "robots").write("per_robot_day", WINDOWS, OFFSETS)
    assert path is not None
    (path.parent / f".{path.name}.123.tmp").write_bytes(b"half a file")
    assert {r["key"] for r in read_landing(tmp_path)} == {"robot-1", "robot-2"}


def test_token_ranges_cover_the_ring_once() -> None:
    for count in (1, 2, 7, 256):
        ranges = token_ranges(count)
        assert len(ranges) == count
        assert ranges[0][0] == MIN_TOKEN and ranges[-1][1] == MAX_TOKEN
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    with pytest.raises(ValueError):
        token_ranges(0)


def test_redis_shard_patterns_split_by_last_byte() -> None:
    patterns = redis_shard_patterns(RedisSource("redis://x", "pre", "pipe"), ["st"], 4)
    assert len(patterns) == 8  # 4 for the states, 4 for the history rows
    assert {name for name, _, _ in patterns} == {"st", "st#history"}
    assert [empty for _, _, empty in patterns] == [True, False, False, False] * 2
    assert patterns[0][1].startswith(b"pre:pipe:s:st:*[")
    assert patterns[4][1].startswith(b"pre:pipe:s:st#history:*[")
    with pytest.raises(ValueError):
        redis_shard_patterns(RedisSource("redis://x", "pre", "pipe"), ["st"], 0)


def test_decode_row_gives_open_and_closed_windows() -> None:
    state = encode_state(AggregateState(
        {"open": {"0": {"ok": 1, "failed": 2}, "60000": {"ok": 5, "failed": 0}}, "max_ts": 61},
        {("t", 0): (3, 0)}))
    assert sorted(decode_row("m", "robot-1", state, ["m"])) == [
        ("m", "robot-1", 0, False, '{"ok":1,"failed":2}'),
        ("m", "robot-1", 60_000, False, '{"ok":5,"failed":0}'),
    ]
    assert decode_row("m#history", "120000|robot-1", b'{"ok":1}', ["m"]) == [
        ("m", "robot-1", 120_000, True, '{"ok":1}')]
    assert decode_row("other", "robot-1", state, ["m"]) == []
    plain = encode_state(AggregateState({"ok": 1, "failed": 0}))
    assert decode_row("m", "robot-1", plain, ["m"]) == []  # not windowed
    # A non-windowed stage gives its state as it is, also one that looks windowed.
    assert decode_row("p", "robot-1", plain, ["m"], ["p"]) == [
        ("p", "robot-1", None, False, '{"ok":1,"failed":0}')]
    assert decode_row("p", "robot-1", state, [], ["p"]) == [
        ("p", "robot-1", None, False,
         '{"open":{"0":{"ok":1,"failed":2},"60000":{"ok":5,"failed":0}},"max_ts":61}')]
    assert decode_row("p#history", "0|robot-1", b"1", [], ["p"]) == []


def test_parse_time() -> None:
    assert parse_time("1767225600000") == 1_767_225_600_000
    assert parse_time("2026-01-01T00:00:00Z") == 1_767_225_600_000
    assert parse_time("2026-01-01T00:00:00") == 1_767_225_600_000
    assert parse_time("2026-01-01T01:00:00+01:00") == 1_767_225_600_000


def test_a_plain_stage_flush_lands_its_states_with_their_progress(tmp_path: Path) -> None:
    zone = LandingZone(tmp_path, "robots", plain=["per_robot"])
    states = {
        "robot-1": encode_state(AggregateState({"ok": 3}, {("in", 0): (41,), ("in", 2): (7, 1)})),
        "robot-2": encode_state(AggregateState({"ok": 1}, {("in", 1): (5,)})),
    }
    path = zone.write_states("per_robot", states, OFFSETS)
    assert path is not None and path.parent == tmp_path / "stage=per_robot"
    rows = pq.read_table(path).to_pylist()
    assert [(r["key"], json.loads(r["value"]), r["window_start"], r["progress"])
            for r in rows] == [("robot-1", {"ok": 3}, None, 48), ("robot-2", {"ok": 1}, None, 5)]
    assert all(r["written_ms"] > 0 for r in rows)
    assert zone.write_states("per_robot", states, OFFSETS) == path  # same states: same file
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    changed = {**states, "robot-2": encode_state(AggregateState({"ok": 2}, {("in", 1): (9,)}))}
    assert zone.write_states("per_robot", changed, OFFSETS) != path
    # Windowed stages (and the producer sequences) land closed windows only.
    assert zone.write_states("per_robot_minute", states, OFFSETS) is None
    assert zone.write_states("__producer_seq__", states, OFFSETS) is None


def test_source_landing_reads_every_aggregate_with_files_and_names_the_rest(
        tmp_path: Path) -> None:
    """Windowed and non-windowed aggregates alike; one no flush has landed is left out."""
    from onceflow.analytics.frames import landing_stages
    from onceflow.runtime.config import load_settings
    from onceflow.stages import Pipeline, Tumbling

    pipeline = (Pipeline("p", topics=("t",), format="json")
                .aggregate("total", key=lambda e: "k", init=lambda: 0, fold=lambda n, e: n + 1)
                .aggregate("per_minute", key=lambda e: "k", init=lambda: 0,
                           fold=lambda n, e: n + 1, window=Tumbling(60_000, lambda e: 0))
                .aggregate("quiet", key=lambda e: "k", init=lambda: 0, fold=lambda n, e: n))
    zone = LandingZone(tmp_path / "landing", "p", ["total", "quiet"])
    zone.write("per_minute", WINDOWS, OFFSETS)
    zone.write_states("total", {"k": encode_state(AggregateState(3, {}))}, OFFSETS)
    conf = tmp_path / "app.conf"
    conf.write_text(f'onceflow.pipeline = "x:p"\nonceflow.landing.dir = "{tmp_path}/landing"\n')

    assert landing_stages(load_settings(str(conf)), pipeline) == (
        ["total", "per_minute"], ["quiet"])
