"""The commonest segment, run fused for speed: stateless steps, then one aggregate
without windows, and nothing after it.

The general path (``runner.PipelineRunner``) builds a plan per record, then
applies it, handling windows, values an upstream aggregate stopped, late
events and republished outputs. None of them can occur here, so a record
whose keys are all cached is folded straight from its values: per key, the
values at or below the route's watermark (replays) are dropped, the rest
folded, and every new state installed only once all of the record's values
folded and checked (a failing fold, or a state no store can hold,
``guards.check_state``, leaves every state as it was: the record is one unit).
``tests/unit/test_single_fold.py`` checks it against the general path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onceflow.stages.guards import check_state
from onceflow.stages.lineage import Position, Route
from onceflow.stages.outcome import BatchOutcome, ConsumedRecord, KeyHomedElsewhere, StageFailure
from onceflow.stages.plan import Fold, Head, Plan
from onceflow.stages.segments import AGGREGATE, REPUBLISH, Segment, through
from onceflow.stages.state import TopicPartition
from onceflow.stages.state_table import StateTable


class FoldSegment:
    """A segment of map, filter and flat-map steps ending in one non-windowed aggregate."""

    def __init__(self, steps: Segment, check_home: bool):
        *stateless, (_, stage, key, table, _) = steps
        assert key is not None and table is not None
        self.stateless = [(kind, stage, fn) for kind, stage, fn, _, _ in stateless
                          if fn is not None]
        self.stage, self.key, self.table = stage, key, table
        self.fold: Callable[[Any, Any], Any] = table.spec.fold  # read once (spec: uncompiled)
        self.check_home = check_home
        self.folded = self.replayed = 0  # this batch's, until ``count`` moves them

    def count(self, outcome: BatchOutcome) -> None:
        """Move this batch's counts into the outcome (one update per batch, not per record)."""
        if self.folded:
            outcome.folded[self.table.spec.id] += self.folded
        if self.replayed:
            outcome.duplicates[self.table.spec.id] += self.replayed

    def reset(self) -> None:
        """Start a batch from zero (one that raised left its counts behind)."""
        self.folded = self.replayed = 0

    @classmethod
    def of(cls, steps: Segment, check_home: bool) -> FoldSegment | None:
        """The fused form of ``steps``, or None if they have another shape."""
        if not steps:
            return None
        kind, _, _, table, _ = steps[-1]
        if kind is not AGGREGATE or table is None or table.spec.window is not None:
            return None
        if any(kind in (AGGREGATE, REPUBLISH) for kind, *_ in steps[:-1]):
            return None
        return cls(steps, check_home)

    def run(self, record: ConsumedRecord, fed_from: TopicPartition, head: Head,
            outcome: BatchOutcome) -> Plan | None:
        """Fold the record's values; answers its plan instead when a key is not cached or
        not a string (the runner checks, loads and applies it). StageFailure as the
        general path raises it."""
        _, root, route, values, positions = head
        stage = ""
        try:
            for kind, stage, fn in self.stateless:  # noqa: B007 (the except)
                values, positions = through(kind, fn, values, positions)
            stage = self.stage
            key_of = self.key
            keys = [key_of(value) for value in values]  # compiled, a loop beats map()
        except Exception as error:
            raise StageFailure(stage, error) from error
        if not self.table.holds(keys):
            return Plan(record, root, route, [Fold(self.table, keys, positions, values)])
        self._fold(keys, positions, values, route, fed_from)
        return None

    def apply(self, plan: Plan, fed_from: TopicPartition, outcome: BatchOutcome) -> bool:
        """Fold a plan of this segment's shape (a record held back while states loaded)
        as ``run`` would have (its counts moved by ``count``, as ``run``'s); False, with
        nothing done, if a key is not cached or not a string (the runner applies it on
        the general path)."""
        share = plan.order[0]
        assert len(plan.order) == 1 and type(share) is Fold and share.table is self.table
        if not self.table.holds(share.keys):
            return False
        self._fold(share.keys, share.positions, share.values, plan.route, fed_from)
        return True

    def _fold(self, keys: list[Any], positions: list[Position], values: list[Any],
              route: Route, fed_from: TopicPartition) -> None:
        folded, replayed = fold_values(self.table, self.fold, keys, positions, values, route,
                                       fed_from, self.check_home)
        self.folded += folded
        self.replayed += replayed


def fold_values(table: StateTable, fold: Callable[[Any, Any], Any], keys: list[Any],
                positions: list[Position], values: list[Any], route: Route,
                fed_from: TopicPartition, check_home: bool) -> tuple[int, int]:
    """Fold one record's values (their keys cached): (values folded, replays dropped);
    StageFailure, with nothing installed, if a fold raises, makes a state no store can
    hold, or a key is homed on another partition."""
    if not keys:
        return 0, 0
    if keys.count(keys[0]) == len(keys):  # one key: a record's values usually share it
        return _fold_one_key(table, fold, keys[0], positions, values, route, fed_from,
                             check_home)
    states = table.states
    new: dict[str, list[Any]] = {}  # key -> [state value, highest position folded]
    replayed = folded = 0
    # equal lengths; no strict=: compiled, zip with a keyword is a generic iterator
    for key, pos, value in zip(keys, positions, values):  # noqa: B905
        current = new.get(key)
        if current is None:
            state = states[key]
            if check_home and state.home != fed_from:
                raise StageFailure(table.spec.id, KeyHomedElsewhere(key, fed_from,
                                                                    state.home or fed_from))
            mark = state.watermarks.get(route)
            if mark is not None and pos <= mark:
                replayed += 1
                continue
            current = new[key] = [state.value, pos]
        elif pos <= current[1]:
            replayed += 1
            continue
        current[1] = pos
        try:
            current[0] = fold(current[0], value)
        except Exception as error:
            raise StageFailure(table.spec.id, error, key) from error
        folded += 1
    stage_id, limit = table.spec.id, table.max_bytes
    for key, current in new.items():
        check_state(stage_id, key, current[0], limit)
    dirty = table.dirty
    for key, (value, pos) in new.items():
        state = states[key]
        state.value = value
        state.watermarks[route] = pos
        dirty.add(key)
    return folded, replayed


def _fold_one_key(table: StateTable, fold: Callable[[Any, Any], Any], key: str,
                  positions: list[Position], values: list[Any], route: Route,
                  fed_from: TopicPartition, check_home: bool) -> tuple[int, int]:
    """``fold_values`` for values of one key: the state folded in a local, no table of
    new states."""
    state = table.states[key]
    if check_home and state.home != fed_from:
        raise StageFailure(table.spec.id, KeyHomedElsewhere(key, fed_from,
                                                            state.home or fed_from))
    value = state.value
    last = state.watermarks.get(route)  # the highest position folded
    replayed = folded = 0
    for pos, item in zip(positions, values):  # noqa: B905 (as in fold_values)
        if last is not None and pos <= last:
            replayed += 1
            continue
        last = pos
        try:
            value = fold(value, item)
        except Exception as error:
            raise StageFailure(table.spec.id, error, key) from error
        folded += 1
    if folded:
        assert last is not None
        check_state(table.spec.id, key, value, table.max_bytes)
        state.value = value
        state.watermarks[route] = last
        table.dirty.add(key)
    return folded, replayed
