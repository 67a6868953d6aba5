"""Segments ending in windowed aggregates, run fused for speed: stateless steps, then
one or more tumbling-window aggregates in a row, and nothing after them (the chain
example's aggregator: per-minute counts feeding daily counts).

The general path (``runner.PipelineRunner``) builds a plan per record, checks
its keys, then applies it through ``windows.fold_windowed`` and three layers
of watermark calls per value. Here a record whose keys are all cached is
folded straight from its values by the same rules, in the same order: per
aggregate, every value counts towards the stage's watermark (replays and
stopped values too), values at or below the route's watermark are dropped
as replays, windows the watermark passed close (history rows), a value whose
window closed already is late (counted, routed to the late topic, and
stopped with the replays: later aggregates never see it), the rest folded;
every new state is installed only once the whole record folded (a failing
fold, a window value no store can hold, ``guards.check_state``, or a key homed
elsewhere installs nothing). Anything else (a key not
cached or not a string, a replay whose late events were written before)
answers the record's plan for the general path.
``tests/unit/test_window_fold.py`` checks it against the general path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from onceflow.stages.guards import check_state
from onceflow.stages.lineage import Position, RootPartition, Route
from onceflow.stages.outcome import (
    BatchOutcome,
    ConsumedRecord,
    KeyHomedElsewhere,
    Output,
    StageFailure,
    late_event,
)
from onceflow.stages.plan import Fold, Head, Plan
from onceflow.stages.segments import AGGREGATE, REPUBLISH, Segment, through
from onceflow.stages.side_outputs import SideOutputs
from onceflow.stages.state import TopicPartition
from onceflow.stages.state_table import StateTable
from onceflow.stages.watermark import FutureEventTime, PartitionWatermark, future_limit
from onceflow.stages.window_clock import WindowClock
from onceflow.stages.windows import closed_to_of

UNKNOWN = object()  # a key's earliest open window, not read yet


class WindowStage:
    """One windowed aggregate of the segment, its parts at hand."""

    __slots__ = ("clock", "event_time", "fold", "folded", "id", "init", "key", "late",
                 "replayed", "size", "span", "table")

    def __init__(self, stage: str, key: Callable[[Any], Any], table: StateTable,
                 clock: WindowClock):
        window = table.spec.window
        assert window is not None
        self.id, self.key, self.table, self.clock = stage, key, table, clock
        self.fold, self.init = table.spec.fold, table.spec.init
        self.event_time = window.event_time_ms
        self.size = window.size_ms
        self.span = window.size_ms + window.allowed_lateness_ms  # a window's start to its close
        self.folded = self.replayed = self.late = 0  # this batch's, until ``count`` moves them


class WindowSegment:
    """A segment of map, filter and flat-map steps ending in windowed aggregates only."""

    def __init__(self, steps: Segment, check_home: bool, clocks: dict[StateTable, WindowClock],
                 side: SideOutputs, late_topic: str, pipeline_id: str, max_value: int):
        first = next(i for i, (kind, *_) in enumerate(steps) if kind is AGGREGATE)
        self.stateless = [(kind, stage, fn) for kind, stage, fn, _, _ in steps[:first]
                          if fn is not None]
        self.stages = []
        for _, stage, key, table, _ in steps[first:]:
            assert key is not None and table is not None
            self.stages.append(WindowStage(stage, key, table, clocks[table]))
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
                    keys = [key_of(value) for value in values]  # compiled: beats map()
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
        """``general_path.GeneralPath.apply`` for this shape, with ``fold_windowed`` and the
        watermark's observe inlined.

        Per key, the record works on one copy of the open windows (made at its first
        change: the stored state is never mutated, units roll back) and keeps their
        earliest start, so a rising watermark with nothing due costs a comparison; the
        state is built once, when installed. Every position of a record has one length
        (each flat-map adds one level to all), so a later stage's stopped values are a
        set. A key's earliest open start comes from the clock's open-window index while
        the record has not changed the key's windows and the index lists the key for this
        partition (it is kept for every installed state, as the sweep needs it), else from
        the windows themselves.
        """
        check_home = self.check_home
        # Boxed once: mypyc keeps a tuple[str, int] unboxed and builds a new tuple object
        # for each dict, set or comparison it meets (about 20 per record here).
        fed_key: Any = fed_from
        root_key: Any = root
        route_key: Any = route
        stopped: set[Position] | None = None  # made when a stage stops a value
        staged: list[tuple[WindowStage, dict[str, list[Any]], int, int, int]] = []
        late_outputs: list[Output] = []
        for window_stage, keys in zip(self.stages, keyed):  # noqa: B905 (one per stage)
            stage_id, states = window_stage.id, window_stage.table.states
            fold, init, event_time = window_stage.fold, window_stage.init, window_stage.event_time
            size, span = window_stage.size, window_stage.span
            clock = window_stage.clock
            max_bytes = window_stage.table.max_bytes
            stage_mark = clock.watermark
            partitions: dict[Any, PartitionWatermark] = stage_mark.partitions
            if fed_key not in partitions:
                clock.meet(fed_from)
            open_keys: dict[str, Any] = clock.open.keys
            mark, idle_ms = partitions[fed_key], stage_mark.idle_ms
            max_future: int = clock.max_future_ms
            limit = future_limit(record.timestamp, max_future)  # None: not bounded
            bounded = limit is not None
            highest: int = limit if limit is not None else 0  # unboxed, for each value
            marks_dirty: set[Any] = stage_mark.dirty
            # key -> [open windows, closed to, own copy, earliest start (UNKNOWN: not read),
            #         position, closed windows, open windows changed]
            new: dict[str, list[Any]] = {}
            halted: list[Position] = []  # replays and late values (a position occurs once)
            folded = replayed = late = 0
            moved = False  # the partition's maxima changed: marked dirty once per record
            slot: str | None = None  # the last window start as a JSON key, and that start
            slot_start = 0
            # equal lengths; no strict=: compiled, zip with a keyword is a generic iterator
            for key, pos, value in zip(keys, positions, values):  # noqa: B905
                try:  # StageWatermark.observe, inlined
                    stamp: Any = event_time(value)  # int(stamp), but the object itself
                    if type(stamp) is not int:  # when it is one: observe keeps it
                        stamp = int(stamp)
                    ts: int = stamp
                    if bounded and ts > highest:  # never reaches the watermark
                        raise FutureEventTime(ts, highest - max_future, max_future)
                    if mark.held_until == -1:
                        mark.held_until = ts + idle_ms
                    # compiled: a direct call (a bound method is not)
                    if mark.observe(root_key, stamp) and not moved:
                        marks_dirty.add(fed_key)
                        moved = True
                    watermark: Any = mark.value  # an object: compared with the states' own
                except Exception as error:
                    raise StageFailure(stage_id, error, key) from error
                if stopped is not None and pos in stopped:
                    continue
                current = new.get(key)
                if current is None:
                    state = states[key]
                    if check_home and state.home != fed_key:
                        raise StageFailure(stage_id, KeyHomedElsewhere(
                            key, fed_from, state.home or fed_from))
                    route_marks: dict[Any, Position] = state.watermarks
                    seen = route_marks.get(route_key)
                    if seen is not None and pos <= seen:
                        replayed += 1
                        halted.append(pos)
                        continue
                    windows: Any = state.value  # Any: a damaged state fails as on the general path
                    try:  # as fold_windowed reads it
                        closed_to = closed_to_of(windows)
                        current = new[key] = [windows["open"], closed_to, False, UNKNOWN, pos,
                                              None, False]
                    except Exception as error:
                        raise StageFailure(stage_id, error, key) from error
                elif pos <= current[4]:
                    replayed += 1
                    halted.append(pos)
                    continue
                current[4] = pos
                try:  # windows.fold_windowed, inlined
                    start = ts - ts % size
                    closed_to = current[1]
                    if watermark is not None and (closed_to is None or watermark > closed_to):
                        watermark_ms: int = watermark
                        last_start = watermark_ms - span  # windows starting there or before close
                        first = current[3]
                        if first is UNKNOWN:  # the index is the installed windows', so
                            known: Any = None if current[2] else open_keys.get(key)  # not a copy's
                            if known is not None and known[0] == fed_key and \
                                    known[1] is not None:
                                first = known[1] - span
                            else:  # a loop: min(map(int, ...), default=None) is 4x as dear
                                first = None
                                for open_slot in current[0]:
                                    start_ms = int(open_slot)
                                    if first is None or start_ms < first:
                                        first = start_ms
                            current[3] = first
                        if first is not None and cast(int, first) <= last_start:
                            opened = current[0]
                            due = [s for s in opened if int(s) <= last_start]
                            closed = sorted((int(s), opened[s]) for s in due)
                            opened = current[0] = {s: v for s, v in opened.items()
                                                   if int(s) > last_start}
                            current[2] = True
                            current[3] = min(map(int, opened), default=None)
                            current[5] = [*(current[5] or ()), *closed]
                            current[6] = True
                        closed_to = current[1] = watermark
                    late_by: Any = None  # None: on time; else by how much it is late
                    if closed_to is not None:  # unboxed: no new int objects
                        closed_ms: int = closed_to
                        behind = closed_ms - start - span
                        if behind >= 0:
                            late_by = behind
                    if late_by is None:
                        opened = current[0]
                        if not current[2]:
                            opened = current[0] = dict(opened)
                            current[2] = True
                        if slot is None or start != slot_start:  # JSON object keys are
                            slot, slot_start = str(start), start  # strings: one per window
                        if slot in opened:
                            opened[slot] = fold(opened[slot], value)
                        else:
                            opened[slot] = fold(init(), value)
                            current[6] = True
                            first = current[3]
                            if first is not UNKNOWN and (first is None or start < first):
                                current[3] = start
                except Exception as error:
                    raise StageFailure(stage_id, error, key) from error
                if late_by is None:
                    check_state(stage_id, key, current[0][slot], max_bytes)
                    folded += 1
                    continue
                late += 1
                halted.append(pos)
                late_outputs.append(late_event(
                    self.late_topic, record, stage_id, key, pos, late_by, root, self.max_value,
                    self.pipeline_id, len(late_outputs)))
            staged.append((window_stage, new, folded, replayed, late))
            if halted:
                if stopped is None:
                    stopped = set()
                stopped.update(halted)
        for window_stage, new, folded, replayed, late in staged:
            window_stage.folded += folded
            window_stage.replayed += replayed
            window_stage.late += late
            table, clock = window_stage.table, window_stage.clock
            states, dirty, history = table.states, table.dirty, table.closed
            for key, (opened, closed_to, _, _, pos, closing, reopened) in new.items():
                state = states[key]
                state.value = installed = {"open": opened, "max_ts": closed_to}
                route_marks = state.watermarks
                route_marks[route_key] = pos
                dirty.add(key)
                clock.note(key, fed_key, installed, reopened)
                if closing:
                    for start, final in closing:
                        history[(key, start)] = final
        if late_outputs:
            outcome.outputs.extend(self.side.placed(late_outputs, record))
