"""The bounded state cache: which states go, which stay, and what a reload gives back.

Pure logic over the runner and its state tables, with a dict standing in for the
store and snapshots written later than they are taken, as persistence does.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from onceflow.stages import Aggregate, Pipeline, Tumbling
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import AggregateState, decode_state, encode_state
from onceflow.stages.state_table import StateTable
from onceflow.testing_records import Consumed as Rec

SECOND = 1000


def pipeline() -> Pipeline:
    """{"k": key, "n": amount, "ts": ms}: a sum per key and a count per key and second."""
    return (
        Pipeline("p", topics=("in",), format="json")
        .aggregate("sum", key=lambda r: r["k"], init=lambda: 0, fold=lambda s, r: s + r["n"])
        .aggregate("per_second", key=lambda r: r["k"], init=lambda: 0,
                   fold=lambda c, _: c + 1, window=Tumbling(SECOND, lambda r: r["ts"]))
    )


def record(offset: int, key: str, n: int = 1, ts: int = 0) -> Rec:
    return Rec("in", 0, offset, json.dumps({"k": key, "n": n, "ts": ts}).encode())


class Store:
    """Encoded states and history rows by (stage, key), as Redis holds them."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], bytes] = {}
        self.history: dict[tuple[str, str, int], Any] = {}
        self.loaded: list[str] = []

    def load(self, spec: Aggregate, keys: Sequence[str]) -> Mapping[str, AggregateState]:
        self.loaded += keys
        found = {key: self.rows.get((spec.id, key)) for key in keys}
        return {key: decode_state(data) for key, data in found.items() if data is not None}


Snapshot = tuple[int, dict[str, dict[str, bytes]], dict[str, dict[tuple[str, int], Any]]]


def take(runner: PipelineRunner, number: int) -> Snapshot:
    """Encode the dirty states and closed windows, as the pipeline actor's snapshot does."""
    return (number, {t.spec.id: t.take_dirty(number) for t in runner.tables},
            {t.spec.id: t.take_closed() for t in runner.tables})


def write(store: Store, runner: PipelineRunner, snapshot: Snapshot) -> None:
    """Persistence wrote it (history first): its states may be evicted now."""
    number, states, closed = snapshot
    for stage, windows in closed.items():
        for (key, start), value in windows.items():
            store.history[(stage, key, start)] = value
    for stage, rows in states.items():
        for key, data in rows.items():
            store.rows[(stage, key)] = data
    for table in runner.tables:
        table.written(number)


def evict(runner: PipelineRunner) -> int:
    return sum(table.evict() for table in runner.tables)


def table_of(spec_id: str = "sum", max_states: int = 2) -> StateTable:
    (spec,) = [a for a in pipeline().aggregates if a.id == spec_id]
    return StateTable(spec, max_states)


def install(table: StateTable, *keys: str) -> None:
    for key in keys:
        table.install(key, AggregateState(0))


# --- the table -------------------------------------------------------------------


def test_written_states_go_least_recently_changed_first() -> None:
    table = table_of(max_states=2)
    install(table, "a", "b", "c")
    table.dirty = {"a"}
    table.take_dirty(1)  # "a" changed last: the most recent now
    table.written(1)

    assert table.evict() == 1
    assert list(table.states) == ["c", "a"]  # "b", the least recent, went
    install(table, "d")
    assert table.evict() == 1 and list(table.states) == ["a", "d"]
    assert table.evictions == 2


def test_dirty_states_are_never_evicted_and_the_cache_may_exceed_its_limit() -> None:
    table = table_of(max_states=1)
    install(table, "a", "b", "c")
    table.dirty = {"a", "b", "c"}

    assert table.evict() == 0 and len(table.states) == 3  # every state is the only copy

    table.take_dirty(1)
    assert table.evict() == 0  # taken, not written yet: still the only durable-to-be copy
    table.written(1)
    assert table.evict() == 2 and len(table.states) == 1


def test_a_state_changed_again_stays_until_its_latest_snapshot_is_written() -> None:
    table = table_of(max_states=1)
    install(table, "a", "b")
    table.dirty = {"a", "b"}
    table.take_dirty(1)
    table.dirty = {"a"}
    table.take_dirty(2)
    table.written(1)  # "a" waits for snapshot 2

    assert table.evict() == 1 and list(table.states) == ["a"]
    table.written(2)
    install(table, "c")
    assert table.evict() == 1 and list(table.states) == ["c"]


def test_encoded_bytes_follow_loads_writes_and_evictions() -> None:
    table = table_of(max_states=1)
    stored = encode_state(AggregateState(41, {("in", 0): (3,)}))
    table.install("a", decode_state(stored))
    table.install("b", AggregateState(0))  # new: nothing encoded yet
    assert table.encoded_bytes == len(stored)
    table.states["b"].value = 123456
    table.dirty = {"b"}
    written = table.take_dirty(1)["b"]
    assert table.encoded_bytes == len(stored) + len(written)
    table.written(1)
    table.evict()
    assert list(table.states) == ["b"] and table.encoded_bytes == len(written)


def test_forgetting_refuses_states_not_written_yet() -> None:
    table = table_of()
    install(table, "a")
    table.dirty = {"a"}
    table.take_dirty(1)
    with pytest.raises(RuntimeError, match="unpersisted"):
        table.clear()
    table.written(1)
    table.clear()
    assert not table.states and table.encoded_bytes == 0


# --- eviction and reload through the runner ----------------------------------------


def test_an_evicted_key_reloads_its_written_state_and_watermarks() -> None:
    store = Store()
    runner = PipelineRunner(pipeline(), store.load, "dlq", max_states=1)
    runner.process([record(0, "a", 5, ts=100), record(1, "a", 7, ts=200)])
    write(store, runner, take(runner, 1))
    runner.process([record(2, "b", 1, ts=300)])
    write(store, runner, take(runner, 2))
    assert evict(runner) == 2  # "a" from both aggregates
    table = runner.tables[0]
    assert list(table.states) == ["b"]

    # Kafka re-delivers a's records: the reloaded watermark discards them.
    outcome = runner.process([record(0, "a", 5, ts=100), record(1, "a", 7, ts=200)])
    assert store.loaded.count("a") == 4  # first sight and the reload, in both aggregates
    assert outcome.duplicates["sum"] == 2 and not outcome.folded
    assert table.states["a"].value == 12
    assert table.states["a"].watermarks == {("in", 0): (1,)}
    # Nothing closed yet: the watermark (200) is below the second's close at 1000.
    assert runner.tables[1].states["a"].value == {"open": {"0": 2}, "max_ts": 200}
    runner.process([record(3, "a", 1, ts=1500)])  # a new one folds onto the stored value
    assert table.states["a"].value == 13
    assert runner.tables[1].states["a"].value == {"open": {"1000": 1}, "max_ts": 1500}
    # The watermark (1500) closes "b"'s window too, though "b" sent nothing since.
    assert runner.tables[1].closed == {("a", 0): 2, ("b", 0): 1}


def test_a_state_taken_but_not_written_is_not_reloaded_stale() -> None:
    """The snapshot is in flight: evicting "a" now and reloading the store's older copy
    would drop the 5 folded into it (and write that loss with the next snapshot)."""
    store = Store()
    runner = PipelineRunner(pipeline(), store.load, "dlq", max_states=1)
    runner.process([record(0, "a", 5)])
    in_flight = take(runner, 1)
    runner.process([record(1, "b", 1), record(2, "c", 1)])
    evict(runner)
    runner.process([record(3, "a", 1)])
    write(store, runner, in_flight)
    write(store, runner, take(runner, 2))

    assert decode_state(store.rows[("sum", "a")]).value == 6


# --- any interleaving ---------------------------------------------------------------


KEYS = ("a", "b", "c", "d", "e")


class CacheMachine(RuleBasedStateMachine):
    """Records, snapshots written late, re-deliveries and crashes, under a cache of 2
    states and 5 keys: the store ends with exactly the input, once."""

    def __init__(self) -> None:
        super().__init__()
        self.store = Store()
        self.log: list[Rec] = []
        self.pending: deque[tuple[Snapshot, int]] = deque()  # with the offsets it covers
        self.snapshots = 0
        self.committed = 0
        self.evicted = 0
        self.runner = self._start()

    def _start(self) -> PipelineRunner:
        return PipelineRunner(pipeline(), self.store.load, "dlq", max_states=2)

    def _process(self, records: list[Rec]) -> None:
        self.runner.process(records)
        self.evicted += evict(self.runner)  # after every batch, as the pipeline actor does
        for table in self.runner.tables:  # within the limit, or nothing left to evict
            clean = [k for k in table.states if k not in table.dirty and k not in table.unwritten]
            assert len(table.states) <= 2 or not clean

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6))
    def feed(self, keys: list[str]) -> None:
        start = len(self.log)
        batch = [record(start + i, key, n=start + i + 1, ts=(start + i) * 400)
                 for i, key in enumerate(keys)]
        self.log += batch
        self._process(batch)

    @rule()
    def snapshot(self) -> None:
        self.snapshots += 1
        self.pending.append((take(self.runner, self.snapshots), len(self.log)))

    @precondition(lambda self: self.pending)
    @rule()
    def write_oldest(self) -> None:
        snapshot, offsets = self.pending.popleft()
        write(self.store, self.runner, snapshot)
        self.committed = offsets

    @precondition(lambda self: self.log)
    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        start = data.draw(st.integers(0, len(self.log) - 1))
        self._process(self.log[start:start + 3])

    @rule(batch=st.integers(1, 4))
    def crash(self, batch: int) -> None:
        """Unwritten snapshots and the cache are lost; the log replays from the commit."""
        self.pending.clear()
        self.runner = self._start()
        for start in range(self.committed, len(self.log), batch):
            self._process(self.log[start:start + batch])

    def teardown(self) -> None:
        while self.pending:
            self.write_oldest()
        self.snapshot()
        self.write_oldest()
        sums: dict[str, int] = {}
        windows: dict[tuple[str, int], int] = {}
        for rec in self.log:
            doc = json.loads(rec.value or b"")
            sums[doc["k"]] = sums.get(doc["k"], 0) + doc["n"]
            slot = (doc["k"], doc["ts"] - doc["ts"] % SECOND)
            windows[slot] = windows.get(slot, 0) + 1
        stored = {key: decode_state(data).value for (stage, key), data in self.store.rows.items()
                  if stage == "sum"}
        assert stored == sums
        got = {(key, start): n for (_, key, start), n in self.store.history.items()}
        for (stage, key), data in self.store.rows.items():
            if stage == "per_second":
                got.update({(key, int(start)): n
                            for start, n in decode_state(data).value["open"].items()})
        assert got == windows


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
