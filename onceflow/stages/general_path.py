"""The general path: one record's plan folded into its aggregates and emitted by its
republish steps, by the rules every shape shares.

The runner comes here for what its fused paths (``single_fold``, ``window_fold``)
do not take: records held back while states loaded, segments of another shape,
and replays whose late events were written before (``side_outputs``). Those
fused paths are checked against this one (``tests/unit/test_window_fold.py``).
"""

from __future__ import annotations

from collections import Counter
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
from onceflow.stages.pipeline import Aggregate
from onceflow.stages.plan import Emit, Fold, Plan, is_stopped
from onceflow.stages.side_outputs import SideOutputs
from onceflow.stages.state_table import StateTable
from onceflow.stages.watermark import FutureEventTime, future_limit
from onceflow.stages.window_clock import WindowClock
from onceflow.stages.windows import fold_windowed


class GeneralPath:
    """Applies plans (``runner.PipelineRunner._plan``) to the runner's states."""

    def __init__(self, clocks: dict[StateTable, WindowClock], side: SideOutputs,
                 check_home: bool, late_topic: str, max_value: int, pipeline_id: str):
        self.clocks, self.side, self.check_home = clocks, side, check_home
        self.late_topic, self.max_value, self.pipeline_id = late_topic, max_value, pipeline_id

    def apply(self, plan: Plan, outcome: BatchOutcome) -> None:
        """Fold one record's values into new states, then install them all at once.

        A value an aggregate finds already folded (a replay), or too late for
        its window, travels no further: later aggregates and republish steps
        never see it. That is why states are persisted downstream first
        (docs/architecture.md, invariant 6: downstream first). Outputs, like
        states, are kept back until the whole record has applied: a step that
        fails later dead-letters the record with nothing of it produced
        (invariant 3). So is a record whose fold makes a value no store can hold
        (``guards.check_state``: each non-windowed key's new value once the step has
        folded it, each window's value as it is folded).
        """
        staged: list[tuple[StateTable, dict[str, list[Any]]]] = []
        counts: list[tuple[Counter[str], str, int]] = []
        emitted: list[Output] = []
        late_outputs: list[Output] = []
        stopped: list[tuple[int, set[Position]]] = []  # (position length, positions)
        fed_from = (plan.record.topic, plan.record.partition)
        check_home = self.check_home
        route, root = plan.route, plan.root
        forced = self.side.late.of(plan.record) if len(self.side.late) else None
        first_late = max(forced.values()) + 1 if forced else 0  # above those already written
        for step in plan.order:
            if type(step) is Emit:
                emitted.extend(
                    out for pos, out in zip(step.positions, step.outputs, strict=True)
                    if not (stopped and is_stopped(pos, stopped)))
                continue
            assert type(step) is Fold
            table = step.table
            spec, states = table.spec, table.states
            fold, window = spec.fold, spec.window
            event_time = window.event_time_ms if window is not None else None
            clock = self.clocks[table] if window is not None else None
            limit: int | None = None  # the highest event time not refused (watermark)
            if clock is not None:
                clock.meet(fed_from)
                limit = future_limit(plan.record.timestamp, clock.max_future_ms)
            # key -> [state value, position, closed windows, open windows changed]
            new: dict[str, list[Any]] = {}
            replayed: set[Position] = set()
            late: set[Position] = set()
            folded = 0
            # Parallel lists of one length (built so by _plan); no strict=: compiled, zip with
            # a keyword is a generic iterator.
            for key, pos, value in zip(step.keys, step.positions, step.values):  # noqa: B905
                if clock is not None:  # replays, and values an upstream aggregate stopped, too:
                    try:  # the watermark is a function of the partition's records alone
                        ts = int(event_time(value))  # type: ignore[misc]
                        if limit is not None and ts > limit:  # never reaches the watermark
                            raise FutureEventTime(ts, limit - clock.max_future_ms,
                                                  clock.max_future_ms)
                        watermark = clock.observe(fed_from, root, ts)
                    except Exception as error:
                        raise StageFailure(spec.id, error, key) from error
                if stopped and is_stopped(pos, stopped):
                    continue
                current = new.get(key)
                if current is None:
                    state = states[key]
                    if check_home and state.home != fed_from:
                        raise StageFailure(spec.id, KeyHomedElsewhere(
                            key, fed_from, state.home or fed_from))
                    mark = state.watermarks.get(route)
                    if mark is not None and pos <= mark:
                        replayed.add(pos)
                        continue
                    current = new[key] = [state.value, pos, None, False]
                elif pos <= current[1]:
                    replayed.add(pos)
                    continue
                current[1] = pos
                if forced is not None and (spec.id, pos) in forced:
                    late.add(pos)  # late in a run before this replay: written already
                    continue
                try:
                    if clock is None:
                        current[0] = fold(current[0], value)
                        folded += 1
                        continue
                    assert window is not None
                    result = fold_windowed(window, spec.init, fold, current[0], value, watermark,
                                           ts)
                except Exception as error:
                    raise StageFailure(spec.id, error, key) from error
                if result.late_by_ms is None:  # the window this value was folded into
                    check_state(spec.id, key, result.state["open"][str(ts - ts % window.size_ms)],
                                table.max_bytes)
                current[0] = result.state
                if result.closed:
                    current[2] = [*(current[2] or ()), *result.closed]
                    current[3] = True
                elif result.opened:
                    current[3] = True
                if result.late_by_ms is not None:
                    late.add(pos)
                    late_outputs.append(self._late(plan, spec, key, pos, result.late_by_ms,
                                                   first_late + len(late_outputs)))
                else:
                    folded += 1
            if clock is None:  # every key of ``new`` folded a value (late ones are windowed)
                for key, current in new.items():
                    check_state(spec.id, key, current[0], table.max_bytes)
            staged.append((table, new))
            if folded:
                counts.append((outcome.folded, spec.id, folded))
            if replayed:
                counts.append((outcome.duplicates, spec.id, len(replayed)))
                stopped.append((len(next(iter(replayed))), replayed))
            if late:
                counts.append((outcome.late, spec.id, len(late)))
                stopped.append((len(next(iter(late))), late))
        for table, new in staged:
            states, dirty = table.states, table.dirty
            clock = self.clocks.get(table)
            for key, (value, pos, closed, reopened) in new.items():
                state = states[key]
                state.value = value
                state.watermarks[route] = pos
                dirty.add(key)
                if clock is not None:
                    clock.note(key, fed_from, value, reopened)
                if closed:
                    for start, final in closed:
                        table.closed[(key, start)] = final
        for counter, stage_id, n in counts:
            counter[stage_id] += n
        if emitted:
            outcome.outputs.extend(emitted)
        if late_outputs:
            outcome.outputs.extend(self.side.placed(late_outputs, plan.record, first_late))

    def _late(self, plan: Plan, spec: Aggregate, key: str, pos: Position,
              late_by_ms: int, index: int) -> Output:
        return late_event(self.late_topic, plan.record, spec.id, key, pos, late_by_ms,
                          plan.root, self.max_value, self.pipeline_id, index)
