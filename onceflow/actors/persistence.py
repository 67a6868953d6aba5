"""PersistenceActor: writes snapshots to the stores, downstream stages first.

Thread: the actor's own; store calls block it, retried with backoff. The
checkpoint ledger decides: a snapshot is written only once every record
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

from onceflow.actors import faults, metrics
from onceflow.actors.base import FatalHandler, ReportingActor
from onceflow.actors.fence import EpochFence, epoch_source
from onceflow.actors.ledger import LedgerError, SharedLedger
from onceflow.actors.log_marks import LOGS_STAGE, mark_rows
from onceflow.actors.messages import (
    PersistenceMessage,
    Snapshot,
    StageRows,
    unexpected,
)
from onceflow.actors.retry import retrying
from onceflow.stages.state import TopicPartition
from onceflow.stores.base import StateStore
from onceflow.stores.fencing import Fenced, Guard

log = logging.getLogger(__name__)


class WindowSink(Protocol):
    """Where closed windows (and non-windowed stages' states) go besides the store
    (``onceflow.analytics.landing.LandingZone``)."""

    def write(self, stage_id: str, windows: Mapping[tuple[str, int], bytes],
              offsets: Mapping[TopicPartition, int]) -> object: ...

    def write_states(self, stage_id: str, states: Mapping[str, bytes],
                     offsets: Mapping[TopicPartition, int]) -> object: ...


class PersistenceActor(ReportingActor):
    def __init__(
        self,
        *,
        stores: Mapping[str, StateStore],
        ledger: SharedLedger,
        stats_store: StateStore | None,
        on_fatal: FatalHandler,
        landing: WindowSink | None = None,
        fence: EpochFence | None = None,
    ):
        super().__init__(on_fatal)
        self._fence = fence
        self._stores = stores
        self._ledger = ledger
        self._stats_store = stats_store
        self._landing = landing

    def on_receive(self, message: PersistenceMessage) -> Mapping[TopicPartition, int]:
        if not isinstance(message, PersistenceMessage):
            unexpected("PersistenceActor", message)
        # Records produced from these inputs first: an aggregate that
        # forwards to a republish step discards replays once its state is
        # written, so its outputs must be settled before (docs/architecture.md,
        # invariant 5).
        for settling in message.settling:
            settling.result()  # a send that failed fails the snapshot: nothing is written
        checkpoint = message.checkpoint
        with self._ledger() as ledger:
            ledger.settled(checkpoint.sends)
            if not ledger.writable(checkpoint):
                raise LedgerError(f"checkpoint {checkpoint.number} may not be written: "
                                  f"{ledger.why_not_writable(checkpoint)}")
        try:
            landed = self._write(message)
        except Fenced as error:
            self._fenced(error, message)
            # Fail the pipeline now, whoever asked: a Flush in a revoke callback would
            # only have its exception logged by aiokafka.
            self._on_fatal(type(self).__name__, error)
            raise
        if landed and faults.KILL_AFTER_LANDING:
            faults.die()
        with self._ledger() as ledger:
            ledger.written(checkpoint)
        stats = self._stats_store
        if stats is not None:
            retrying("stats", lambda: stats.add_stats(message.stats))
        return checkpoint.offsets

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
        if checkpoint.marks and marks is not None:  # after the states: they hold these records
            retrying("save log marks", lambda: marks.save(
                LOGS_STAGE, mark_rows(checkpoint.marks), guard=guard))
        fenced = epoch_source(self._stores.values())
        if guard and not message.rows and fenced is not None:
            # Nothing to write, but its offsets become durable: only if still the owner.
            retrying("check epochs", lambda: fenced.check_epochs(guard))
        return landed

    def _marks_store(self) -> StateStore | None:
        """Where log marks go: the pipeline's first store (``onceflow.actors.log_marks``)."""
        return next(iter(self._stores.values()), None)

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
            retrying(f"save {rows.stage_id}",
                     lambda: store.save(rows.stage_id, rows.states, guard=guard))
        metrics.PERSISTED.labels(rows.stage_id).inc(len(rows.states))
        return landed


def write_order(rows: Sequence[StageRows]) -> Iterable[StageRows]:
    """Downstream first: the snapshot's rows reversed (the producer sequences, first in
    the list, are written last)."""
    return rows if faults.UPSTREAM_FIRST else reversed(rows)
