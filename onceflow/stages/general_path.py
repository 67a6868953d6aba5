"""The general path: one record's plan folded into its aggregates and emitted by its
republish steps, by the rules every path shares (``fold_rules``).

The runner comes here for what its fused paths (``single_fold``, ``window_fold``)
do not take: records held back while states loaded, segments of another shape,
and replays whose late events were written before (``side_outputs``).
"""

from __future__ import annotations

from collections import Counter
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
from onceflow.stages.lineage import Position
from onceflow.stages.outcome import BatchOutcome, Output, StageFailure, late_event
from onceflow.stages.plan import Emit, Fold, Plan
from onceflow.stages.side_outputs import SideOutputs
from onceflow.stages.state_table import StateTable
from onceflow.stages.window_clock import WindowClock


class GeneralPath:
    """Applies plans (``runner.PipelineRunner._plan``) to the runner's states."""

    def __init__(self, clocks: dict[StateTable, WindowClock], side: SideOutputs,
                 check_home: bool, late_topic: str, max_value: int, pipeline_id: str):
        self.windows = {table: WindowStage(table.spec.key, table, clock)
                        for table, clock in clocks.items()}
        self.side, self.check_home = side, check_home
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
        unit: list[Share] = []
        counts: list[tuple[Counter[str], str, int]] = []
        emitted: list[Output] = []
        late_outputs: list[Output] = []
        stopped: Stopped = []
        fed_from: Any = (plan.record.topic, plan.record.partition)
        check_home = self.check_home
        route: Any = plan.route
        root: Any = plan.root
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
            stage_id, fold = table.stage_id, table.spec.fold
            stage = self.windows.get(table)
            mark = stage.begin(fed_from, plan.record.timestamp) if stage is not None else None
            new: dict[str, Staged] = {}
            replayed: set[Position] = set()
            late: set[Position] = set()
            folded = 0
            for key, pos, value in zip(step.keys, step.positions, step.values):  # noqa: B905
                ts, watermark = 0, None
                if stage is not None and mark is not None:
                    try:
                        ts = stage.observe(root, value)
                    except Exception as error:
                        raise StageFailure(stage_id, error, key) from error
                    watermark = mark.value
                if stopped and is_stopped(pos, stopped):
                    continue
                staged = new.get(key)
                if staged is None:
                    staged = new[key] = touch(table, key, route, fed_from, check_home)
                if not admit(staged, pos):
                    replayed.add(pos)
                    continue
                if forced is not None and (stage_id, pos) in forced:
                    late.add(pos)  # late in a run before this replay: written already
                    continue
                try:
                    if stage is None:
                        staged.value = fold(staged.value, value)
                        folded += 1
                        continue
                    late_by = fold_window(stage, staged, value, ts, watermark)
                except Exception as error:
                    raise StageFailure(stage_id, error, key) from error
                if late_by is None:
                    check_state(stage_id, key, staged.opened[stage.slot], table.max_bytes)
                    folded += 1
                    continue
                late.add(pos)
                late_outputs.append(late_event(
                    self.late_topic, plan.record, stage_id, key, pos, late_by, plan.root,
                    self.max_value, self.pipeline_id, first_late + len(late_outputs)))
            if stage is None:  # every admitted key folded a value (late ones are windowed)
                for staged in new.values():
                    if staged.admitted:
                        check_state(stage_id, staged.key, staged.value, table.max_bytes)
            unit.append((table, None if stage is None else stage.clock, new.values()))
            if folded:
                counts.append((outcome.folded, stage_id, folded))
            if replayed:
                counts.append((outcome.duplicates, stage_id, len(replayed)))
            if late:
                counts.append((outcome.late, stage_id, len(late)))
            stop(stopped, replayed)
            stop(stopped, late)
        install_unit(unit, route, fed_from)
        for counter, stage_id, n in counts:
            counter[stage_id] += n
        if emitted:
            outcome.outputs.extend(emitted)
        if late_outputs:
            outcome.outputs.extend(self.side.placed(late_outputs, plan.record, first_late))
