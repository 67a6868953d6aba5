"""PersistenceActor: writes snapshots to the stores, downstream stages first.

Thread: the actor's own; store calls block it, retried with backoff. A
snapshot's offsets become durable only after every state in it is written
and every record produced before it is acknowledged; then, and only then,
the commit actor hears of them (DESIGN.md invariants 5 and 6).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pykka

from onceflow.actors import faults
from onceflow.actors.base import FatalHandler, ReportingActor
from onceflow.actors.messages import Barrier, Durable, Snapshot, StageRows
from onceflow.actors.retry import retrying
from onceflow.stores.base import StateStore


class PersistenceActor(ReportingActor):
    def __init__(
        self,
        *,
        stores: Mapping[str, StateStore],
        producer: pykka.ActorRef[Any],
        commit: pykka.ActorRef[Any],
        stats_store: StateStore | None,
        on_fatal: FatalHandler,
    ):
        super().__init__(on_fatal)
        self._stores = stores
        self._producer = producer
        self._commit = commit
        self._stats_store = stats_store

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, Snapshot):
            raise TypeError(f"PersistenceActor: unexpected message {message!r}")
        order = message.rows if faults.UPSTREAM_FIRST else reversed(message.rows)
        for rows in order:  # downstream first
            self._save(self._stores[rows.store], rows)
            if rows.stage_id == faults.KILL_AFTER_SAVE:
                faults.die()
        self._producer.ask(Barrier())
        self._commit.tell(Durable(message.offsets))
        stats = self._stats_store
        if stats is not None:
            retrying("stats", lambda: stats.add_stats(message.stats))
        return message.offsets

    @staticmethod
    def _save(store: StateStore, rows: StageRows) -> None:
        """Closed windows first: the states written next no longer hold them."""
        if rows.closed_windows:
            retrying(f"save history {rows.stage_id}",
                     lambda: store.save_history(rows.stage_id, rows.closed_windows))
        retrying(f"save {rows.stage_id}", lambda: store.save(rows.stage_id, rows.states))
