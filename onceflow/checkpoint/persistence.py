"""Persistence: writes snapshots to the stores, downstream stages first.

Thread: its own (the checkpoint coordinator's single persistence thread);
store calls block it, retried with backoff. The checkpoint ledger decides
(``coordinator.Checkpoints`` asks it, on the loop): a snapshot is written only once every record
produced before it is settled (acknowledged, or in the outbox) and every
earlier snapshot is written, and only once its states are written does the
ledger hold its offsets durable (docs/architecture.md, invariants 5 and 6).

With a landing zone, each stage's closed windows are also written as one
Parquet file, after its history rows and before its states (which no longer
hold those windows), so a committed offset implies its files exist and a
crash before the states replays the windows' closing
(``onceflow.analytics.landing`` explains why that stays idempotent). A
non-windowed stage's states go to a file too, just before the store.

Fencing: every store write of a snapshot carries the epochs of the partitions
the snapshot depends on (``Checkpoint.depends``), checked by the store
atomically with the write. A refused write (``Fenced``: another worker took a
partition over while this one was paused) is counted, logged and fails the
actor: nothing more of the snapshot is written, its offsets never become
durable, and the supervisor restarts the pipeline from what is durable
(docs/architecture.md, "Fencing"). A landing file is written only after its
history rows passed the check.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from onceflow import faults
from onceflow.actors import metrics
from onceflow.actors.messages import Snapshot, StageRows
from onceflow.checkpoint.log_marks import MarkRows, mark_rows
from onceflow.stages.declarations import LOGS_STAGE
from onceflow.stages.state import TopicPartition
from onceflow.stores.base import StateStore
from onceflow.stores.fencing import Fenced, Guard
from onceflow.stores.fencing.held_epochs import EpochFence, epoch_source
from onceflow.stores.retry import retrying

log = logging.getLogger(__name__)


class WindowSink(Protocol):
    """Where closed windows (and non-windowed stages' states) go besides the store
    (``onceflow.analytics.landing.LandingZone``)."""

    def write(self, stage_id: str, windows: Mapping[tuple[str, int], bytes],
              offsets: Mapping[TopicPartition, int]) -> object: ...

    def write_states(self, stage_id: str, states: Mapping[str, bytes],
                     offsets: Mapping[TopicPartition, int]) -> object: ...


class StoreWriter:
    """Writes one snapshot, downstream first; run on persistence's own thread by the
    checkpoint coordinator (``coordinator.Checkpoints``), which tells the ledger."""

    def __init__(
        self,
        *,
        stores: Mapping[str, StateStore],
        stats_store: StateStore | None,
        landing: WindowSink | None = None,
        fence: EpochFence | None = None,
        marks: MarkRows | None = None,
    ):
        self._fence = fence
        self._marks = marks
        self._stores = stores
        self._stats_store = stats_store
        self._landing = landing

    def write(self, message: Snapshot) -> None:
        """Every row of the snapshot (its sends are settled and the ledger said writable)."""
        try:
            landed = self._write(message)
        except Fenced as error:  # the coordinator fails the core
            self._fenced(error, message)
            raise
        if landed and faults.KILL_AFTER_LANDING:
            faults.die()

    def add_stats(self, stats: Mapping[str, int]) -> None:
        store = self._stats_store
        if store is not None:
            retrying("stats", lambda: store.add_stats(stats))

    def _write(self, message: Snapshot) -> bool:
        """Every stage, downstream first; True when a landing file was written."""
        checkpoint = message.checkpoint
        guard = None
        if self._fence is not None and not faults.NO_FENCING:
            guard = self._fence.expect(checkpoint.depends)
        landed = False
        for rows in write_order(message.rows):
            landed |= self._save(self._stores[rows.store], rows, checkpoint.offsets, guard)
            if rows.stage_id == faults.KILL_AFTER_SAVE:
                faults.die()
        marks = self._marks_store()
        # After the states (they hold these records), and after the outputs of these
        # records were acknowledged (the ledger's writable): never a mark ahead of them.
        if checkpoint.marks and marks is not None:
            retrying("save log marks", lambda: marks.save(
                LOGS_STAGE, mark_rows(checkpoint.marks), guard=guard))
        fenced = epoch_source(self._stores.values())
        if guard and not message.rows and fenced is not None:
            # Nothing to write, but its offsets become durable: only if still the owner.
            retrying("check epochs", lambda: fenced.check_epochs(guard))
        return landed

    def _marks_store(self) -> MarkRows | None:
        """Where log marks go (``onceflow.checkpoint.log_marks``): the pipeline's first
        store, or without one the marks given (its topic, ``kafka.log_marks_topic``)."""
        first = next(iter(self._stores.values()), None)
        return self._marks if first is None else first

    def _fenced(self, error: Fenced, message: Snapshot) -> None:
        """Count and log a refused write; the caller fails the actor."""
        metrics.FENCED.inc()
        log.error("%s; snapshot %d (offsets %s) not written: the pipeline restarts from what "
                  "is durable", error, message.checkpoint.number,
                  dict(sorted(message.checkpoint.offsets.items())))
        stats = self._stats_store
        if stats is not None:  # best effort, like every stat
            with contextlib.suppress(Exception):
                stats.add_stats({"fenced_writes": 1})

    def _save(self, store: StateStore, rows: StageRows,
              offsets: Mapping[TopicPartition, int], guard: Guard | None) -> bool:
        """Closed windows first (history, then landing file): the states written next no
        longer hold them. True when a landing file was written."""
        landing = self._landing
        if rows.closed_windows:
            retrying(f"save history {rows.stage_id}",
                     lambda: store.save_history(rows.stage_id, rows.closed_windows, guard=guard))
        landed = False
        if rows.closed_windows and landing is not None:
            retrying(f"landing {rows.stage_id}",
                     lambda: landing.write(rows.stage_id, rows.closed_windows, offsets))
            landed = True
        if rows.states and landing is not None:  # non-windowed stages' history
            landed |= retrying(f"landing {rows.stage_id}", lambda: landing.write_states(
                rows.stage_id, rows.states, offsets)) is not None
        with metrics.STORE_SECONDS.labels(type(store).__name__).time():
            save_states(store, rows, guard)
        metrics.PERSISTED.labels(rows.stage_id).inc(len(rows.states))
        return landed


def save_states(store: StateStore, rows: StageRows, guard: Guard | None) -> None:
    """A stage's states, retried; those that expire with the store's own TTL, set in the
    guarded write (``split_states``)."""
    plain, expiring = split_states(rows)
    stage = rows.stage_id
    if plain or not expiring:
        retrying(f"save {stage}", lambda: store.save(stage, plain, guard=guard))
    if expiring:
        retrying(f"save {stage}", lambda: store.save_expiring(
            stage, expiring, rows.expire_after, guard=guard))


def split_states(rows: StageRows) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(rows written plainly, rows written to expire ``expire_after`` after this write): a
    state its key no longer feeds leaves the store by itself, unless the stage never
    expires or it is ``lasting`` (a window still open; a plain write also clears an
    expiry the row had)."""
    states = rows.states
    if not rows.expire_after:
        return states, {}
    if not rows.lasting:
        return {}, states
    plain = {key: row for key, row in states.items() if key in rows.lasting}
    return plain, {key: row for key, row in states.items() if key not in rows.lasting}


def write_order(rows: Sequence[StageRows]) -> Iterable[StageRows]:
    """Downstream first: the snapshot's rows reversed (the producer sequences, first in
    the list, are written last)."""
    return rows if faults.UPSTREAM_FIRST else reversed(rows)
