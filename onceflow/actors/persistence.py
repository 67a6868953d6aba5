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
(``onceflow.analytics.landing`` explains why that stays idempotent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import pykka

from onceflow.actors import faults, metrics
from onceflow.actors.base import FatalHandler, ReportingActor
from onceflow.actors.ledger import LedgerError, SharedLedger
from onceflow.actors.messages import Barrier, PersistenceMessage, StageRows, unexpected
from onceflow.actors.retry import retrying
from onceflow.stages.state import TopicPartition
from onceflow.stores.base import StateStore

if TYPE_CHECKING:
    from onceflow.actors.producer import ProducerActor


class WindowSink(Protocol):
    """Where closed windows go besides the store (``onceflow.analytics.landing.LandingZone``)."""

    def write(self, stage_id: str, windows: Mapping[tuple[str, int], bytes],
              offsets: Mapping[TopicPartition, int]) -> object: ...


class PersistenceActor(ReportingActor):
    def __init__(
        self,
        *,
        stores: Mapping[str, StateStore],
        producer: pykka.ActorRef[ProducerActor],
        ledger: SharedLedger,
        stats_store: StateStore | None,
        on_fatal: FatalHandler,
        landing: WindowSink | None = None,
    ):
        super().__init__(on_fatal)
        self._stores = stores
        self._producer = producer
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
        settled: int = self._producer.ask(Barrier())  # type: ignore[assignment]
        checkpoint = message.checkpoint
        with self._ledger() as ledger:
            ledger.settled(settled)
            if not ledger.writable(checkpoint):
                raise LedgerError(f"checkpoint {checkpoint.number} may not be written: "
                                  f"{ledger.why_not_writable(checkpoint)}")
        landed = False
        for rows in write_order(message.rows):
            landed |= self._save(self._stores[rows.store], rows, checkpoint.offsets)
            if rows.stage_id == faults.KILL_AFTER_SAVE:
                faults.die()
        if landed and faults.KILL_AFTER_LANDING:
            faults.die()
        with self._ledger() as ledger:
            ledger.written(checkpoint)
        stats = self._stats_store
        if stats is not None:
            retrying("stats", lambda: stats.add_stats(message.stats))
        return checkpoint.offsets

    def _save(self, store: StateStore, rows: StageRows,
              offsets: Mapping[TopicPartition, int]) -> bool:
        """Closed windows first (history, then landing file): the states written next no
        longer hold them. True when a landing file was written."""
        landing = self._landing
        if rows.closed_windows:
            retrying(f"save history {rows.stage_id}",
                     lambda: store.save_history(rows.stage_id, rows.closed_windows))
        landed = False
        if rows.closed_windows and landing is not None:
            retrying(f"landing {rows.stage_id}",
                     lambda: landing.write(rows.stage_id, rows.closed_windows, offsets))
            landed = True
        with metrics.STORE_SECONDS.labels(type(store).__name__).time():
            retrying(f"save {rows.stage_id}", lambda: store.save(rows.stage_id, rows.states))
        metrics.PERSISTED.labels(rows.stage_id).inc(len(rows.states))
        return landed


def write_order(rows: Sequence[StageRows]) -> Iterable[StageRows]:
    """Downstream first: the snapshot's rows reversed (the producer sequences, first in
    the list, are written last)."""
    return rows if faults.UPSTREAM_FIRST else reversed(rows)
