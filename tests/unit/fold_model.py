"""The fold rules written plainly, apart from the engine: the oracle the equivalence tests
(``test_single_fold.py``, ``test_window_fold.py``) compare the engine's paths with.

``ModelPath`` stands in for the runner's general path (``runner._general``): one record's
plan, value by value, with the rules spelled out in the order the docs give them
(``docs/architecture.md``, invariants 2 and 3; ``stages.windows``; ``side_outputs``). It
shares no code with ``stages.fold_rules``; it uses the engine's clock (watermark rows,
open-window index, sweep) as the runner does between records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from onceflow.stages.guards import check_state
from onceflow.stages.lineage import Position
from onceflow.stages.outcome import (
    BatchOutcome,
    KeyHomedElsewhere,
    Output,
    StageFailure,
    late_event,
)
from onceflow.stages.plan import Emit, Fold, Plan
from onceflow.stages.side_outputs import SideOutputs
from onceflow.stages.state_table import StateTable
from onceflow.stages.watermark import FutureEventTime, StageWatermark, future_limit
from onceflow.stages.window_clock import WindowClock
from onceflow.stages.windows import Tumbling


def observe(watermark: StageWatermark, tp: tuple[str, int], root: tuple[str, int], ts: int
            ) -> int | None:
    """An event of ``root`` consumed from ``tp`` (``install`` came first) counted towards
    the stage's watermark; answers the partition's watermark, what the value is decided
    against (the engine's is ``fold_rules.WindowStage.observe``, with its bound)."""
    mark = watermark.partitions[tp]
    if mark.observe(root, ts):
        watermark.dirty.add(tp)
    return mark.value


@dataclass
class NewState:
    """A key's state as the record has changed it so far (installed at the record's end)."""

    value: Any
    mark: Position
    closed: list[tuple[int, Any]] = field(default_factory=list)
    reopened: bool = False


@dataclass
class WindowedFold:
    state: dict[str, Any]
    closed: list[tuple[int, Any]]
    late_by_ms: int | None = None
    opened: bool = False


def fold_windowed(window: Tumbling, init: Any, fold: Any, state: Any, value: Any,
                  watermark: int | None, ts: int) -> WindowedFold:
    """Close the windows the watermark passed; a value whose window closed by then is late;
    else fold it into its window. Never mutates ``state``."""
    closed_to = state["max_ts"]
    if closed_to is not None and type(closed_to) is not int:
        raise TypeError(f"windowed state's max_ts {closed_to!r} is not an int")
    opened = state["open"]
    span = window.size_ms + window.allowed_lateness_ms
    start = ts - ts % window.size_ms
    closed: list[tuple[int, Any]] = []
    rose = watermark is not None and (closed_to is None or watermark > closed_to)
    if rose:
        assert watermark is not None
        closed = sorted((int(s), v) for s, v in opened.items() if int(s) <= watermark - span)
        opened = {s: v for s, v in opened.items() if int(s) > watermark - span}
        closed_to = watermark
    if closed_to is not None and start + span <= closed_to:
        kept = {"open": opened, "max_ts": closed_to} if rose else state
        return WindowedFold(kept, closed, closed_to - start - span)
    opened = dict(opened)
    slot = str(start)
    new_window = slot not in opened
    opened[slot] = fold(init() if new_window else opened[slot], value)
    return WindowedFold({"open": opened, "max_ts": closed_to}, closed, None, new_window)


def stopped_by(position: Position, stopped: list[set[Position]]) -> bool:
    """The value at ``position`` is one an aggregate did not fold, or derives from one."""
    return any(position[:len(next(iter(s)))] in s for s in stopped)


class ModelPath:
    """The runner's general path, written plainly."""

    def __init__(self, clocks: dict[StateTable, WindowClock], side: SideOutputs,
                 check_home: bool, late_topic: str, max_value: int, pipeline_id: str):
        self.clocks, self.side, self.check_home = clocks, side, check_home
        self.late_topic, self.max_value, self.pipeline_id = late_topic, max_value, pipeline_id

    def apply(self, plan: Plan, outcome: BatchOutcome) -> None:
        staged: list[tuple[StateTable, dict[str, NewState]]] = []
        counts: list[tuple[Counter[str], str, int]] = []
        emitted: list[Output] = []
        late_outputs: list[Output] = []
        stopped: list[set[Position]] = []
        record = plan.record
        fed_from = (record.topic, record.partition)
        forced = self.side.late.of(record) if len(self.side.late) else None
        first_late = max(forced.values()) + 1 if forced else 0
        for step in plan.order:
            if isinstance(step, Emit):
                emitted.extend(out for pos, out in zip(step.positions, step.outputs, strict=True)
                               if not stopped_by(pos, stopped))
                continue
            assert isinstance(step, Fold)
            table = step.table
            spec = table.spec
            window = spec.window
            clock = self.clocks.get(table)
            limit = None
            if clock is not None:
                clock.meet(fed_from)
                limit = future_limit(record.timestamp, clock.max_future_ms)
            new: dict[str, NewState] = {}
            replayed: set[Position] = set()
            late: set[Position] = set()
            folded = 0
            for key, pos, value in zip(step.keys, step.positions, step.values, strict=True):
                ts, watermark = 0, None
                if clock is not None:  # every value counts towards the watermark first
                    assert window is not None
                    try:
                        ts = int(window.event_time_ms(value))
                        if limit is not None and ts > limit:
                            raise FutureEventTime(ts, limit - clock.max_future_ms,
                                                  clock.max_future_ms)
                        watermark = observe(clock.watermark, fed_from, plan.root, ts)
                    except Exception as error:
                        raise StageFailure(spec.id, error, key) from error
                if stopped_by(pos, stopped):
                    continue
                current = new.get(key)
                if current is None:
                    state = table.states[key]
                    if self.check_home and state.home != fed_from:
                        raise StageFailure(spec.id, KeyHomedElsewhere(
                            key, fed_from, state.home or fed_from))
                    mark = state.watermarks.get(plan.route)
                    if mark is not None and pos <= mark:
                        replayed.add(pos)
                        continue
                    current = new[key] = NewState(state.value, pos)
                elif pos <= current.mark:
                    replayed.add(pos)
                    continue
                current.mark = pos
                if forced is not None and (spec.id, pos) in forced:
                    late.add(pos)
                    continue
                try:
                    if window is None:
                        current.value = spec.fold(current.value, value)
                        folded += 1
                        continue
                    result = fold_windowed(window, spec.init, spec.fold, current.value, value,
                                           watermark, ts)
                except Exception as error:
                    raise StageFailure(spec.id, error, key) from error
                if result.late_by_ms is None:
                    check_state(spec.id, key, result.state["open"][str(ts - ts % window.size_ms)],
                                table.max_bytes)
                current.value = result.state
                current.closed.extend(result.closed)
                current.reopened = current.reopened or bool(result.closed) or result.opened
                if result.late_by_ms is None:
                    folded += 1
                    continue
                late.add(pos)
                late_outputs.append(late_event(
                    self.late_topic, record, spec.id, key, pos, result.late_by_ms, plan.root,
                    self.max_value, self.pipeline_id, first_late + len(late_outputs)))
            if window is None:
                for key, current in new.items():
                    check_state(spec.id, key, current.value, table.max_bytes)
            staged.append((table, new))
            for counter, n in ((outcome.folded, folded), (outcome.duplicates, len(replayed)),
                               (outcome.late, len(late))):
                if n:
                    counts.append((counter, spec.id, n))
            stopped.extend(s for s in (replayed, late) if s)
        for table, new in staged:  # the whole record folded and checked: install it all
            clock = self.clocks.get(table)
            for key, current in new.items():
                state = table.states[key]
                state.value = current.value
                state.watermarks[plan.route] = current.mark
                table.dirty.add(key)
                if clock is not None:
                    clock.note(key, fed_from, current.value, current.reopened)
                for start, final in current.closed:
                    table.closed[(key, start)] = final
        for counter, stage_id, n in counts:
            counter[stage_id] += n
        outcome.outputs.extend(emitted)
        outcome.outputs.extend(self.side.placed(late_outputs, record, first_late))
