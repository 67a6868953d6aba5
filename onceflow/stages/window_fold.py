"""Segments ending in windowed aggregates, run fused: stateless steps, then one or more
tumbling-window aggregates in a row, and nothing after them (the chain example's
aggregator: per-minute counts feeding daily counts).

A record whose keys are all cached is folded straight from its values, by the rules of
``fold_rules`` in the general path's order: per aggregate, each value's event time
counts towards the watermark, a stopped value goes no further, a duplicate is dropped,
the rest decided late or folded; the record's new states are installed at once.
Anything else (a key not cached or not a string, a replay whose late events were
written before) answers the record's plan for the general path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onceflow.stages.fold_rules import (
    Share,
    Staged,
    Stopped,
    WindowStage,
    admit,
    fold_window,
    install_unit,
    is_stopped,
    stop,
    touch,
)
from onceflow.stages.guards import check_state
from onceflow.stages.lineage import Position, RootPartition, Route
from onceflow.stages.outcome import BatchOutcome, ConsumedRecord, Output, StageFailure, late_event
from onceflow.stages.plan import Fold, Head, Plan
from onceflow.stages.segments import AGGREGATE, REPUBLISH, Segment, through
from onceflow.stages.side_outputs import SideOutputs
from onceflow.stages.state import TopicPartition
from onceflow.stages.state_table import StateTable
from onceflow.stages.window_clock import WindowClock


class WindowSegment:
    """A segment of map, filter and flat-map steps ending in windowed aggregates only."""

    def __init__(self, steps: Segment, check_home: bool, clocks: dict[StateTable, WindowClock],
                 side: SideOutputs, late_topic: str, pipeline_id: str, max_value: int):
        first = next(i for i, (kind, *_) in enumerate(steps) if kind is AGGREGATE)
        self.stateless = [(kind, stage, fn) for kind, stage, fn, _, _ in steps[:first]
                          if fn is not None]
        self.stages = []
        for _, _, key, table, _ in steps[first:]:
            assert key is not None and table is not None
            self.stages.append(WindowStage(key, table, clocks[table]))
        self.check_home = check_home
        self.side = side
        self.late_topic, self.pipeline_id, self.max_value = late_topic, pipeline_id, max_value

    def count(self, outcome: BatchOutcome) -> None:
        """Move this batch's counts into the outcome (one update per batch, not per record)."""
        for stage in self.stages:
            if stage.folded:
                outcome.folded[stage.id] += stage.folded
            if stage.replayed:
                outcome.duplicates[stage.id] += stage.replayed
            if stage.late:
                outcome.late[stage.id] += stage.late

    def reset(self) -> None:
        """Start a batch from zero (one that raised left its counts behind)."""
        for stage in self.stages:
            stage.folded = stage.replayed = stage.late = 0

    @classmethod
    def of(cls, steps: Segment, check_home: bool, clocks: dict[StateTable, WindowClock],
           side: SideOutputs, late_topic: str, pipeline_id: str, max_value: int
           ) -> WindowSegment | None:
        """The fused form of ``steps``, or None if they have another shape."""
        kinds = [kind for kind, *_ in steps]
        if AGGREGATE not in kinds or REPUBLISH in kinds:
            return None
        first = kinds.index(AGGREGATE)
        if any(kind is not AGGREGATE or table is None or table.spec.window is None
               for kind, _, _, table, _ in steps[first:]):
            return None
        return cls(steps, check_home, clocks, side, late_topic, pipeline_id, max_value)

    def run(self, record: ConsumedRecord, fed_from: TopicPartition, head: Head,
            outcome: BatchOutcome) -> Plan | None:
        """Fold the record's values; answers its plan instead when the general path must
        (see the module). StageFailure as the general path raises it."""
        _, root, route, values, positions = head
        stage = ""
        keyed: list[list[Any]] = []
        try:
            for kind, stage, fn in self.stateless:  # noqa: B007 (the except)
                values, positions = through(kind, fn, values, positions)
            keys: list[Any] = []
            last_key_of: Callable[[Any], Any] | None = None
            for window_stage in self.stages:
                stage = window_stage.id
                key_of = window_stage.key
                if key_of is not last_key_of:  # stages keyed alike (minute, day) share a list
                    keys = [key_of(value) for value in values]
                    last_key_of = key_of
                keyed.append(keys)
        except Exception as error:
            raise StageFailure(stage, error) from error
        cached = all(window_stage.table.holds(keys)  # keyed: one per stage
                     for window_stage, keys in zip(self.stages, keyed))  # noqa: B905
        if len(self.side.late) > 0 or not cached:
            return Plan(record, root, route, [
                Fold(window_stage.table, keys, positions, values)
                for window_stage, keys in zip(self.stages, keyed, strict=True)])
        self._fold(record, fed_from, root, route, keyed, values, positions, outcome)
        return None

    def apply(self, plan: Plan, fed_from: TopicPartition, outcome: BatchOutcome) -> bool:
        """Fold a plan of this segment's shape (a record held back while states loaded)
        as ``run`` would have; False, with nothing done, when the general path must apply
        it (see the module)."""
        if len(self.side.late) > 0:
            return False
        keyed: list[list[Any]] = []
        for window_stage, share in zip(self.stages, plan.order, strict=True):
            assert type(share) is Fold and share.table is window_stage.table
            if not window_stage.table.holds(share.keys):
                return False
            keyed.append(share.keys)
        first = plan.order[0]
        assert type(first) is Fold  # every share has the same values and positions
        self._fold(plan.record, fed_from, plan.root, plan.route, keyed, first.values,
                   first.positions, outcome)
        return True

    def _fold(self, record: ConsumedRecord, fed_from: TopicPartition, root: RootPartition,
              route: Route, keyed: list[list[Any]], values: list[Any],
              positions: list[Position], outcome: BatchOutcome) -> None:
        """``general_path.GeneralPath.apply`` for this shape: the same rules, no plan."""
        check_home = self.check_home
        fed_key: Any = fed_from
        root_key: Any = root
        route_key: Any = route
        stopped: Stopped = []
        unit: list[Share] = []
        counts: list[tuple[WindowStage, int, int, int]] = []
        late_outputs: list[Output] = []
        for stage, keys in zip(self.stages, keyed):  # noqa: B905 (one per stage)
            stage_id, table, max_bytes = stage.id, stage.table, stage.max_bytes
            mark = stage.begin(fed_key, record.timestamp)
            new: dict[str, Staged] = {}
            halted: set[Position] = set()  # duplicates and late values
            folded = replayed = late = 0
            for key, pos, value in zip(keys, positions, values):  # noqa: B905
                try:
                    ts = stage.observe(root_key, value)
                except Exception as error:
                    raise StageFailure(stage_id, error, key) from error
                watermark: Any = mark.value
                if stopped and is_stopped(pos, stopped):
                    continue
                staged = new.get(key)
                if staged is None:
                    staged = new[key] = touch(table, key, route_key, fed_key, check_home)
                if not admit(staged, pos):
                    replayed += 1
                    halted.add(pos)
                    continue
                try:
                    late_by = fold_window(stage, staged, value, ts, watermark)
                except Exception as error:
                    raise StageFailure(stage_id, error, key) from error
                if late_by is None:
                    check_state(stage_id, key, staged.opened[stage.slot], max_bytes)
                    folded += 1
                    continue
                late += 1
                halted.add(pos)
                late_outputs.append(late_event(
                    self.late_topic, record, stage_id, key, pos, late_by, root, self.max_value,
                    self.pipeline_id, len(late_outputs)))
            unit.append((table, stage.clock, new.values()))
            counts.append((stage, folded, replayed, late))
            stop(stopped, halted)
        install_unit(unit, route_key, fed_key)
        for stage, folded, replayed, late in counts:
            stage.folded += folded
            stage.replayed += replayed
            stage.late += late
        if late_outputs:
            outcome.outputs.extend(self.side.placed(late_outputs, record))
