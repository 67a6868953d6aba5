"""What a snapshot hands persistence: each table's dirty states and closed windows, the
window clocks' rows and the changed producer sequences, in the order they must be written."""

from __future__ import annotations

from onceflow.actors.messages import StageRows
from onceflow.stages.join_runner import JoinRunner
from onceflow.stages.producer_dedup import SEQUENCE_STAGE
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import compact_json
from onceflow.stages.watermark import WINDOWS_STAGE


def snapshot_rows(runner: PipelineRunner | JoinRunner, sequence_store: str | None,
                  snapshot: int) -> list[StageRows]:
    """Each table's dirty states and closed windows, in pipeline order, and the changed
    producer sequences FIRST: persistence writes the list reversed (downstream first),
    so they are written after every state of the snapshot, never claiming more than
    the states hold (docs/architecture.md, "Producer sequences")."""
    rows = []
    for table in runner.tables:
        dirty = table.take_dirty(snapshot)
        closed = table.take_closed()
        if dirty or closed:
            rows.append(StageRows(
                table.spec.id,
                table.spec.store,
                dirty,
                {slot: compact_json(value) for slot, value in closed.items()},
                table.expire_after,
                table.lasting(dirty),
            ))
    for clock in runner.clocks.values():  # the open-window index first, watermarks last
        store = clock.table.spec.store
        if before := clock.rows_before_states():
            rows.append(StageRows(WINDOWS_STAGE, store, before, {}))
        if after := clock.rows_after_states():
            rows.insert(0, StageRows(WINDOWS_STAGE, store, after, {}))
    sequences = runner.sequences
    if sequences is not None and sequences.dirty:
        assert sequence_store is not None
        rows.insert(0, StageRows(SEQUENCE_STAGE, sequence_store, sequences.take_dirty(), {}))
    return rows
