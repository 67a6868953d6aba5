"""What a snapshot hands persistence: each table's dirty states and closed windows, the
window clocks' rows, the changed producer sequences, in the order they must be written,
and where each co-partition's merge log is read from next (a join's, a single worker's)."""

from __future__ import annotations

from collections.abc import Mapping

from onceflow.actors.messages import StageRows
from onceflow.stages.declarations import MERGE_LOG_STAGE
from onceflow.stages.join_runner import JoinRunner
from onceflow.stages.merge_log import Start, decode_start, encode_start
from onceflow.stages.producer_dedup import SEQUENCE_STAGE
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import compact_json
from onceflow.stages.watermark import WINDOWS_STAGE
from onceflow.stores.base import StateStore
from onceflow.stores.retry import retrying


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
    if isinstance(runner, JoinRunner) and (starts := runner.take_log_starts()):
        # from committed offsets (any time is right): with the runner's first store
        rows.append(StageRows(MERGE_LOG_STAGE, log_store(runner),
                              {str(p): encode_start(start) for p, start in starts.items()}, {}))
    return rows


def log_store(runner: JoinRunner) -> str:
    """Where a runner's merge log starts are kept: the store of its first table."""
    return runner.tables[0].spec.store


def stored_log_starts(stores: Mapping[str, StateStore], runner: PipelineRunner | JoinRunner,
                      numbers: list[int]) -> dict[int, Start]:
    """Where the merge log of co-partitions ``numbers`` may be read from (none for a row
    that is none: that log is read from its start)."""
    assert isinstance(runner, JoinRunner)
    store, keys = stores[log_store(runner)], [str(n) for n in numbers]
    rows = retrying("load merge log starts", lambda: store.load(MERGE_LOG_STAGE, keys))
    starts = {int(key): decode_start(row) for key, row in rows.items()}
    return {n: start for n, start in starts.items() if start is not None}
