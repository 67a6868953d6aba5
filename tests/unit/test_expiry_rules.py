"""State expiry without services: the declaration, the config key, the cache's part, the
rows a snapshot hands persistence, and the start-up check's rule.

The stores' part (their own TTLs) runs against real Redis and Cassandra in
``tests/integration/test_state_expiry.py``; here a dict stands in for the store, and a
hand-set clock for the worker's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from persistence_doubles import DictStore

from onceflow.actors.messages import StageRows
from onceflow.actors.snapshot_rows import snapshot_rows
from onceflow.checkpoint.persistence import save_states
from onceflow.runtime import expiry_check
from onceflow.runtime.config import ConfigError, load_settings
from onceflow.runtime.expiry_check import check_retention, expiries, too_short
from onceflow.runtime.forget import forget_topic
from onceflow.stages import Aggregate, Pipeline, Tumbling
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import AggregateState, decode_state, encode_state
from onceflow.stages.state_table import STORE_SLACK, StateTable
from onceflow.stages.watermark import WINDOWS_STAGE
from onceflow.stores.fencing import Guard
from onceflow.testing_records import Consumed as Rec

SECOND = 1000
PIPELINE = 'onceflow.pipeline = "shop.orders:pipeline"\n'


def counts(expire_after: float | timedelta | None = 60.0) -> Pipeline:
    """{"k": key, "ts": ms}: a count per key, and one per key and second."""
    return (
        Pipeline("p", topics=("in",), format="json")
        .aggregate("count", key=lambda r: r["k"], init=lambda: 0, fold=lambda c, _: c + 1,
                   expire_after=expire_after)
        .aggregate("per_second", key=lambda r: r["k"], init=lambda: 0,
                   fold=lambda c, _: c + 1, window=Tumbling(SECOND, lambda r: r["ts"]),
                   expire_after=expire_after)
    )


def record(offset: int, key: str, ts: int = 0) -> Rec:
    return Rec("in", 0, offset, json.dumps({"k": key, "ts": ts}).encode())


class Clock:
    """The worker's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Store:
    """Encoded states by (stage, key); ``expire`` drops rows as the store's TTL would."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], bytes] = {}

    def load(self, spec: Aggregate, keys: Sequence[str]) -> Mapping[str, AggregateState]:
        found = {key: self.rows.get((spec.id, key)) for key in keys}
        return {key: decode_state(data) for key, data in found.items() if data is not None}

    def expire(self, stage: str, key: str) -> None:
        del self.rows[(stage, key)]


def runner_with_clock(pipeline: Pipeline, store: Store) -> tuple[PipelineRunner, Clock]:
    runner = PipelineRunner(pipeline, store.load, "dlq")
    clock = Clock()
    for table in runner.tables:
        table.clock = clock
    return runner, clock


def snapshot(runner: PipelineRunner, store: Store, number: int) -> list[StageRows]:
    """Take and write a snapshot (the rows persistence gets), as the actor and persistence
    do; the states may then go."""
    rows = snapshot_rows(runner, None, number)
    for stage in rows:
        for key, data in stage.states.items():
            store.rows[(stage.stage_id, key)] = data
    for table in runner.tables:
        table.written(number)
    return rows


# --- the declaration and the config key ---------------------------------------------


def test_expire_after_takes_a_timedelta_or_seconds_and_none_leaves_it_to_the_worker() -> None:
    (count, windowed) = counts(timedelta(days=30)).aggregates
    assert count.expire_after == 30 * 86400.0 and windowed.expire_after == 30 * 86400.0
    assert counts(90).aggregates[0].expire_after == 90.0
    assert counts(0).aggregates[0].expire_after == 0.0  # never, whatever the worker says
    assert counts(None).aggregates[0].expire_after is None


@pytest.mark.parametrize("bad", [-1, 0.5, 7301 * 86400, timedelta(milliseconds=10),
                                 float("nan"), float("inf"), True, "30d"])
def test_expire_after_refuses_what_no_store_can_expire(bad: object) -> None:
    with pytest.raises(ValueError, match="aggregate 'count': expire_after: expected"):
        counts(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expire_after"):
        Aggregate("count", str, int, lambda c, _: c, expire_after=bad)  # type: ignore[arg-type]


def test_the_config_default_is_off_and_an_aggregate_s_own_wins(tmp_path: Path) -> None:
    app = tmp_path / "app.conf"
    app.write_text(PIPELINE)
    assert load_settings(app).state.expire_after == 0.0
    app.write_text(PIPELINE + "onceflow.state.expire-after = 30d\n")
    settings = load_settings(app)
    assert settings.state.expire_after == 30 * 86400.0

    pipeline = (Pipeline("p", topics=("in",))
                .aggregate("default", key=str, init=int, fold=lambda c, _: c)
                .aggregate("own", key=str, init=int, fold=lambda c, _: c, expire_after=60)
                .aggregate("never", key=str, init=int, fold=lambda c, _: c, expire_after=0))
    tables = PipelineRunner(pipeline, lambda spec, keys: {}, "dlq",
                            expire_after=settings.state.expire_after).tables
    assert [t.expire_after for t in tables] == [30 * 86400.0, 60.0, 0.0]
    assert expiries(settings, pipeline) == {"default": 30 * 86400.0, "own": 60.0}


@pytest.mark.parametrize(("value", "expected"), [
    ("500ms", "expected 0s (never expire) or a duration in 1s..7300d, got 500ms"),
    ("7301d", "expected 0s (never expire) or a duration in 1s..7300d, got 7301d"),
    ("30", "expected a duration like 10s or 500ms, got 30"),
])
def test_a_bad_config_expiry_names_the_file_and_the_key(tmp_path: Path, value: str,
                                                        expected: str) -> None:
    app = tmp_path / "app.conf"
    app.write_text(PIPELINE + f"onceflow.state.expire-after = {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(app)
    assert str(caught.value) == f"{app}: onceflow.state.expire-after: {expected}"


# --- the cache ---------------------------------------------------------------------


def table_of(expire_after: float = 60.0, windowed: bool = False) -> tuple[StateTable, Clock]:
    spec = counts(None).aggregates[1 if windowed else 0]
    table = StateTable(spec, expire_after=expire_after)
    clock = Clock()
    table.clock = clock
    return table, clock


#: When the cache lets a state of a 60 s expiry go: a little before its row does, as
#: Cassandra's TTL counts from the whole second of the write (``STORE_SLACK``).
DUE = 60 - STORE_SLACK


def test_a_written_state_expires_from_the_cache_as_long_after_it_was_taken() -> None:
    table, clock = table_of(60)
    for key in ("a", "b"):
        table.install(key, AggregateState(0))
    table.dirty = {"a", "b"}
    table.take_dirty(1)
    table.written(1)
    clock.now += 30
    table.dirty = {"b"}  # b folded again, taken later: its clock starts again
    table.take_dirty(2)
    table.written(2)

    clock.now += DUE - 30 - 1
    assert table.expire() == 0 and list(table.states) == ["a", "b"]
    clock.now += 1
    assert table.expire() == 1 and list(table.states) == ["b"]
    clock.now += 30
    assert table.expire() == 1 and not table.states and not table.stamps
    assert table.expired == 2


def test_a_state_folded_since_or_not_written_yet_stays() -> None:
    """Its store row is older than its folds: dropping it would lose them."""
    table, clock = table_of(60)
    for key in ("dirty", "unwritten", "written"):
        table.install(key, AggregateState(0))
    table.dirty = {"dirty", "unwritten", "written"}
    table.take_dirty(1)
    table.written(1)
    table.dirty = {"unwritten"}
    table.take_dirty(2)  # not written yet
    table.dirty = {"dirty"}  # folded, not taken yet
    clock.now += 61

    assert table.expire() == 1 and set(table.states) == {"dirty", "unwritten"}
    table.written(2)
    clock.now += 61  # the unwritten one was taken at snapshot 2, 122 s ago now
    assert table.expire() == 1 and list(table.states) == ["dirty"]


def test_a_loaded_state_expires_as_long_after_its_load() -> None:
    table, clock = table_of(60)
    table.install("a", AggregateState(3, {("in", 0): (7,)}))
    clock.now += DUE - 1
    assert table.expire() == 0
    clock.now += 1
    assert table.expire() == 1 and not table.states


def test_a_windowed_state_expires_only_once_its_last_window_closed() -> None:
    table, clock = table_of(60, windowed=True)
    table.install("open", AggregateState({"open": {"0": 2}, "max_ts": 100}))
    table.install("closed", AggregateState({"open": {}, "max_ts": 5000}))
    table.dirty = {"open", "closed"}
    taken = table.take_dirty(1)
    assert table.lasting(taken) == {"open"}  # its row is written without an expiry
    table.written(1)
    clock.now += 600

    assert table.expire() == 1 and list(table.states) == ["open"]
    table.states["open"].value = {"open": {}, "max_ts": 2000}  # its window closed (swept)
    table.dirty = {"open"}
    assert table.lasting(table.take_dirty(2)) == frozenset()
    table.written(2)
    clock.now += DUE - 1
    assert table.expire() == 0
    clock.now += 1
    assert table.expire() == 1 and not table.states


def test_without_expiry_nothing_is_stamped_or_dropped() -> None:
    table, clock = table_of(0)
    table.install("a", AggregateState(0))
    table.dirty = {"a"}
    assert table.lasting(table.take_dirty(1)) == frozenset()
    table.written(1)
    clock.now += 10 ** 9
    assert table.expire() == 0 and list(table.states) == ["a"] and not table.stamps


def test_eviction_and_forgetting_drop_the_stamps_too() -> None:
    table, _ = table_of(60)
    table.max_states = 1
    for key in ("a", "b"):
        table.install(key, AggregateState(0))
    assert table.evict() == 1 and list(table.stamps) == ["b"]
    table.clear()
    assert not table.stamps


# --- through the runner: a key seen again starts fresh ---------------------------------


def test_an_expired_key_starts_fresh_and_its_old_events_count_again() -> None:
    """Its watermarks went with the state: a replay older than the expiry is counted again,
    which is why the expiry must exceed the input's retention."""
    store = Store()
    runner, clock = runner_with_clock(counts(60), store)
    runner.process([record(0, "a"), record(1, "a"), record(2, "b")])
    snapshot(runner, store, 1)
    count = runner.tables[0]
    assert count.states["a"].value == 2

    clock.now += 61
    store.expire("count", "a")  # the store's TTL ran out (b's row is left: see below)
    assert count.expire() == 2 and not count.states
    outcome = runner.process([record(1, "a"), record(2, "b")])  # replays
    # a starts fresh, and its replayed event, older than the expiry, counts again
    assert count.states["a"].value == 1
    assert count.states["a"].watermarks == {("in", 0): (1,)}
    # b's row was still in the store: b goes on, and its replay is still a duplicate
    assert count.states["b"].value == 1 and outcome.duplicates["count"] == 1
    runner.process([record(3, "a")])
    assert count.states["a"].value == 2


def test_rows_handed_to_persistence_carry_the_expiry_but_open_windows_do_not_expire() -> None:
    store = Store()
    runner, _ = runner_with_clock(counts(60), store)
    runner.process([record(0, "a", ts=100)])
    stages = {rows.stage_id: rows for rows in snapshot(runner, store, 1)}
    assert (stages["count"].expire_after, stages["count"].lasting) == (60.0, frozenset())
    assert (stages["per_second"].expire_after, stages["per_second"].lasting) == (
        60.0, frozenset({"a"}))
    assert stages[WINDOWS_STAGE].expire_after == 0  # the runtime's own rows never expire

    never = PipelineRunner(counts(0), Store().load, "dlq")
    never.process([record(0, "a", ts=100)])
    assert {(rows.expire_after, rows.lasting) for rows in snapshot_rows(never, None, 1)} == {
        (0.0, frozenset())}


class ExpiringStore(DictStore):
    """The fenced dict store, noting which rows were written to expire, and after how long."""

    def __init__(self) -> None:
        super().__init__()
        self.ttls: dict[tuple[str, str], float] = {}

    def save(self, stage_id: str, rows: Mapping[str, bytes], *, guard: Guard | None = None
             ) -> None:
        super().save(stage_id, rows, guard=guard)
        for key in rows:
            self.ttls.pop((stage_id, key), None)  # a plain write clears an expiry (SET)

    def save_expiring(self, stage_id: str, rows: Mapping[str, bytes], ttl: float, *,
                      guard: Guard | None = None) -> None:
        super().save(stage_id, rows, guard=guard)
        self.ttls.update(dict.fromkeys(((stage_id, key) for key in rows), ttl))


def test_persistence_writes_expiring_rows_with_the_ttl_and_lasting_ones_without() -> None:
    store = ExpiringStore()
    guard = store.take_epochs([("in", 0)]).guard
    save_states(store, StageRows("w", "redis", {"a": b"1", "b": b"2"}, {}, 60.0,
                                 frozenset({"a"})), guard)
    assert store.ttls == {("w", "b"): 60.0}
    assert store.load("w", ["a", "b"]) == {"a": b"1", "b": b"2"}
    assert store.guards == [guard, guard]  # both writes guarded

    save_states(store, StageRows("w", "redis", {"b": b"3"}, {}, 60.0, frozenset({"b"})), guard)
    assert store.ttls == {}  # a window opened again: its row no longer expires
    save_states(store, StageRows("n", "redis", {"c": b"4"}, {}), guard)
    assert store.ttls == {} and store.load("n", ["c"]) == {"c": b"4"}


# --- the start-up check -----------------------------------------------------------------


def test_a_topic_kept_longer_than_a_stage_s_expiry_is_named() -> None:
    expiring = {"count": 3600.0, "daily": 30 * 86400.0}
    retentions: dict[str, int | None] = {"in": 7 * 86400 * 1000, "forever": -1,
                                         "short": 60_000, "unknown": None}
    assert too_short(expiring, retentions) == [
        ("count", "forever", -1), ("daily", "forever", -1), ("count", "in", 7 * 86400 * 1000)]
    assert too_short({}, retentions) == []


def test_onceflow_forget_rewrites_states_that_keep_expiring() -> None:
    """A rewrite without the expiry would keep a retired key's state for ever."""
    store = ExpiringStore()
    pipeline = (Pipeline("p", topics=("orders",), format="json")
                .aggregate("totals", key=str, init=int, fold=lambda c, _: c + 1)
                .aggregate("never", key=str, init=int, fold=lambda c, _: c + 1,
                           expire_after=0)
                .aggregate("per_second", key=str, init=int, fold=lambda c, _: c + 1,
                           window=Tumbling(SECOND, lambda r: 0)))
    marks = {("orders", 0): (4,), ("refunds", 0): (5,)}
    for stage in ("totals", "never"):
        store.rows[(stage, "k")] = encode_state(AggregateState(7, dict(marks)))
    for key, opened in (("open", {"0": 1}), ("closed", {})):
        store.rows[("per_second", key)] = encode_state(AggregateState(
            {"open": opened, "max_ts": 10}, dict(marks)))

    forget_topic({"redis": store}, pipeline, "orders", expire_after=3600)

    assert store.ttls == {("totals", "k"): 3600.0, ("per_second", "closed"): 3600.0}
    assert decode_state(store.rows[("totals", "k")]).watermarks == {("refunds", 0): (5,)}
    assert decode_state(store.rows[("never", "k")]).watermarks == {("refunds", 0): (5,)}


def test_the_start_up_check_warns_per_stage_and_topic_and_names_what_it_could_not_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What the broker answers is stood in for (the embedded broker cannot serve
    DescribeConfigs to aiokafka: tests/integration/test_state_expiry.py)."""
    app = tmp_path / "app.conf"
    app.write_text(PIPELINE + "onceflow.state.expire-after = 1h\n")
    settings = load_settings(app)
    pipeline = (Pipeline("p", topics=("in", "other"))
                .aggregate("count", key=str, init=int, fold=lambda c, _: c + 1))

    async def retentions(*_: object) -> dict[str, int | None]:
        return {"in": 7 * 86400 * 1000, "other": None}

    monkeypatch.setattr(expiry_check, "_retentions", retentions)
    with caplog.at_level(logging.INFO, "onceflow.runtime.expiry_check"):
        check_retention(settings, pipeline)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "stage 'count': states expire after 3600s, but topic 'in' keeps records 604800s "
        "(retention.ms 604800000): a replay of records older than the expiry would fold them "
        "again; raise expire_after above the retention, or never replay that far "
        "(docs/guide/pipelines-and-steps.md, State expiry)"]
    assert "state expiry not checked against other: the broker did not report their " \
        "retention.ms" in caplog.text

    caplog.clear()
    never = (Pipeline("p", topics=("in",))
             .aggregate("count", key=str, init=int, fold=lambda c, _: c + 1, expire_after=0))
    check_retention(settings, never)  # nothing expires: no request, nothing said
    assert not caplog.records
