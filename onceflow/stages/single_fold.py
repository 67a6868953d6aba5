"""The commonest segment, run fused for speed: stateless steps, then one aggregate
without windows, and nothing after it.

The general path (``general_path``) builds a plan per record, then applies it,
handling windows, values an upstream aggregate stopped, late events and
republished outputs. None of them can occur here, so a record whose keys are all
cached is folded straight from its values, by the rules of ``fold_rules``: per
key, duplicates dropped (``admit``), the rest folded, every new state checked, then
installed at once (``install``): the record is one unit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onceflow.stages.fold_rules import Staged, admit, install_key, touch
from onceflow.stages.guards import check_state
from onceflow.stages.lineage import Position, Route
from onceflow.stages.outcome import BatchOutcome, ConsumedRecord, StageFailure
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
        self.fold: Callable[[Any, Any], Any] = table.spec.fold  # read once
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
            keys = [key_of(value) for value in values]
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
                positions: list[Position], values: list[Any], route: Any,
                fed_from: Any, check_home: bool) -> tuple[int, int]:
    """Fold one record's values (their keys cached): (values folded, replays dropped);
    StageFailure, with nothing installed, if a fold raises, makes a state no store can
    hold, or a key is homed on another partition."""
    if not keys:
        return 0, 0
    stage_id = table.stage_id
    replayed = folded = 0
    first: str = keys[0]
    if keys.count(first) == len(keys):  # one key: a record's values usually share it
        one = touch(table, first, route, fed_from, check_home)
        for pos, value in zip(positions, values):  # noqa: B905
            if not admit(one, pos):
                replayed += 1
                continue
            try:
                one.value = fold(one.value, value)
            except Exception as error:
                raise StageFailure(stage_id, error, first) from error
            folded += 1
        if folded:
            check_state(stage_id, first, one.value, table.max_bytes)
            install_key(table, None, one, route, fed_from)
        return folded, replayed
    new: dict[str, Staged] = {}
    for key, pos, value in zip(keys, positions, values):  # noqa: B905
        staged = new.get(key)
        if staged is None:
            staged = new[key] = touch(table, key, route, fed_from, check_home)
        if not admit(staged, pos):
            replayed += 1
            continue
        try:
            staged.value = fold(staged.value, value)
        except Exception as error:
            raise StageFailure(stage_id, error, key) from error
        folded += 1
    for staged in new.values():
        if staged.admitted:
            check_state(stage_id, staged.key, staged.value, table.max_bytes)
    for staged in new.values():
        install_key(table, None, staged, route, fed_from)
    return folded, replayed
