"""A join's table as onceflow state: per key the versions of its row, with watermarks.

Each key's state is an ``AggregateState`` (one write, invariant 4) whose value lists
the row's versions, ``[[table offset, row or None], ...]``, and whose watermarks hold
the highest table offset applied per table partition (invariant 2): a replayed table
record at or below it is a duplicate and discarded. Versions, not only the latest row,
because a snapshot may hold a table further ahead than the stream's states (both are
written in one snapshot, but the stream's may be discarded on replay while the
table's are not): a stream record sees the newest version below the table's *cursor*,
the next table offset in merge order (``stages.merge_log``), so a replay meets the
row the first run met whatever the store holds. Versions below the lowest cursor a
replay can start at (the committed offset: ``floor``) are dropped, but the newest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from onceflow.shared_types import ConsumedRecord
from onceflow.stages.formats import parser_for
from onceflow.stages.guards import check_state
from onceflow.stages.join_step import Join
from onceflow.stages.outcome import BatchOutcome, StageFailure
from onceflow.stages.state import AggregateState
from onceflow.stages.state_table import StateTable
from onceflow.stages.steps import Aggregate

#: Loads stored states by key (the runner's loader: ``StateLoader``).
Loader = Callable[[Aggregate, Sequence[str]], Mapping[str, AggregateState]]
#: A version of a row: [table offset, row] (row None: deleted by a tombstone).
Version = list[Any]


def _no_state() -> list[Version]:
    return []


def _no_fold(state: Any, value: Any) -> Any:
    raise AssertionError("a join table is not folded by the runner")


class JoinTable:
    """The rows of one join's table, as the join's stage ``join.id`` in ``table.store``."""

    def __init__(self, join: Join, load: Loader, max_state_bytes: int, latest: bool = False,
                 max_states: int | None = None):
        self.join = join
        self.spec = Aggregate(join.id, key=str, init=_no_state, fold=_no_fold,
                              store=join.table.store)
        # bounded as the aggregates' caches (``evict``: written rows, least recently used)
        self.table = StateTable(self.spec, max_states, max_state_bytes)
        self._load = load
        self._parse = parser_for(join.table.topic, join.table.format)
        self.cursor: dict[int, int] = {}  # table partition -> next table offset, merge order
        self.floor: dict[int, int] = {}  # table partition -> committed offset
        self.partition = 0  # the co-partition of the stream run being joined
        self.latest = latest  # the naive join (faults.NO_MERGE_LOG): the newest row

    def row(self, key: str) -> Any:
        """``key``'s row as of the cursor of the current co-partition (None: no row)."""
        if type(key) is not str:
            raise TypeError(f"join {self.join.id!r}: on() must return a str, got "
                            f"{type(key).__name__}")
        state = self._state(key)
        for topic, partition in state.watermarks:
            if partition != self.partition:
                raise ValueError(f"key {key!r} has its row in {topic}/{partition}, the value "
                                 f"came from partition {self.partition}: the table must be "
                                 "keyed by the join key, with the stream's partition count")
        versions: list[Version] = state.value
        if self.latest:
            return versions[-1][1] if versions else None
        cursor = self.cursor.get(self.partition, 0)
        for offset, row in reversed(versions):
            if offset < cursor:
                return row
        return None

    def has_row(self, value: Any) -> bool:
        """The filter of ``missing="drop"``."""
        return self.row(self.join.on(value)) is not None

    def enrich(self, value: Any) -> Any:
        """The join as a map step: ``merge(value, row)``."""
        return self.join.merge(value, self.row(self.join.on(value)))

    def apply(self, records: list[ConsumedRecord], outcome: BatchOutcome,
              reject: Callable[[ConsumedRecord, Exception], None]) -> None:
        """Apply a run of table records in order: each a new version of its key's row, or a
        duplicate below the key's watermark; one that fails to parse is ``reject``ed."""
        parsed: list[tuple[ConsumedRecord, str, Any]] = []
        for record in records:
            try:
                parsed.append((record, *self._row_of(record)))
            except Exception as error:
                reject(record, StageFailure(self.join.id, error))
        missing = [key for _, key, _ in parsed if key not in self.table.states]
        if missing:
            self._install(sorted(set(missing)))
        stage = self.join.id
        for record, key, row in parsed:
            state = self.table.states[key]
            route = (record.topic, record.partition)
            mark = state.watermarks.get(route)
            if mark is not None and (record.offset,) <= mark:
                outcome.duplicates[stage] += 1
                continue
            versions = self._trim([*state.value, [record.offset, row]], record.partition)
            try:
                check_state(stage, key, versions, self.table.max_bytes)
            except StageFailure as failure:
                reject(record, failure)
                continue
            state.value = versions
            state.watermarks = {**state.watermarks, route: (record.offset,)}
            self.table.dirty.add(key)
            self.table.states.move_to_end(key)
            outcome.folded[stage] += 1

    def committed(self, partition: int, offset: int) -> None:
        """A replay of table ``partition`` starts at ``offset`` or later from now on."""
        self.floor[partition] = max(offset, self.floor.get(partition, 0))

    def _row_of(self, record: ConsumedRecord) -> tuple[str, Any]:
        table = self.join.table
        if record.value is None:  # a tombstone: the key's row is gone
            return _kafka_key(record), None
        value, _ = self._parse(record)
        key = _kafka_key(record) if table.key is None else table.key(value)
        if type(key) is not str:
            raise TypeError(f"table key must be a str, got {type(key).__name__}")
        return key, table.value(value)

    def _trim(self, versions: list[Version], partition: int) -> list[Version]:
        """Versions a replay may still need: those at or past the floor, and the newest
        one below it."""
        floor = self.floor.get(partition, 0)
        below = [i for i, (offset, _) in enumerate(versions) if offset < floor]
        return versions[below[-1]:] if below else versions

    def _state(self, key: str) -> AggregateState:
        """``key``'s row versions, loaded if not cached; now the most recently used."""
        states = self.table.states
        state = states.get(key)
        if state is None:
            self._install([key])
            return states[key]
        states.move_to_end(key)
        return state

    def _install(self, keys: list[str]) -> None:
        loaded = self._load(self.spec, keys)
        for key in keys:
            self.table.install(key, loaded.get(key) or AggregateState(_no_state()))


def _kafka_key(record: ConsumedRecord) -> str:
    if record.key is None:
        raise ValueError("a table record needs a Kafka key (or Table(key=...))")
    return record.key.decode(errors="replace")
