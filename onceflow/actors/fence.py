"""The epochs this worker holds for its input partitions (docs/architecture.md, "Fencing").

Shared by the consumer (which takes new epochs on each assignment), the
persistence actor (which guards a snapshot's writes with the epochs of the
partitions the snapshot depends on) and the outbox writer (guarded with every
held epoch). Pure bookkeeping under a lock; the store calls are the callers'.

An epoch that jumped (the store answered more than the last one taken here,
plus one) means another worker held the partition in between, so what this
worker still holds of it in memory may be older than the store: the
partition is *moved*. Its new epoch is kept back until the caller has
forgotten that progress (``release``), so no write of the old progress can
pass under the new epoch meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from onceflow.actors.retry import retrying
from onceflow.stages.state import TopicPartition
from onceflow.stores.base import StateStore
from onceflow.stores.fencing import Fenced, Guard

log = logging.getLogger(__name__)


class EpochFence:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[TopicPartition, int] = {}  # writable under these epochs
        self._kept_back: dict[TopicPartition, int] = {}  # moved: until released
        self._last: dict[TopicPartition, int] = {}  # the last epoch taken here, ever

    def assign(self, epochs: Mapping[TopicPartition, int]) -> set[TopicPartition]:
        """A new assignment with the epochs just taken; answers the moved partitions.

        Partitions not in ``epochs`` are no longer held: a write depending on
        them is refused from now on.
        """
        with self._lock:
            moved = {tp for tp, epoch in epochs.items()
                     if tp in self._last and epoch != self._last[tp] + 1}
            self._last.update(epochs)
            self._held = {tp: e for tp, e in epochs.items() if tp not in moved}
            self._kept_back = {tp: epochs[tp] for tp in moved}
            return moved

    def release(self, partitions: Iterable[TopicPartition]) -> None:
        """The moved ``partitions``' old progress is forgotten: write under their new epochs."""
        with self._lock:
            for tp in partitions:
                if tp in self._kept_back:
                    self._held[tp] = self._kept_back.pop(tp)

    def drop(self, partitions: Iterable[TopicPartition]) -> None:
        """Revoked (flushed and forgotten): no write depends on them any more."""
        with self._lock:
            for tp in partitions:
                self._held.pop(tp, None)
                self._kept_back.pop(tp, None)

    def expect(self, depends: Iterable[TopicPartition]) -> Guard:
        """The guard of a write depending on ``depends``; refused here if one is not held."""
        with self._lock:
            for tp in sorted(depends):
                if tp not in self._held:
                    raise Fenced(tp, None, None)
            return {tp: self._held[tp] for tp in depends}

    def held(self) -> Guard:
        """Every epoch held now (the outbox's guard: its rows are not traced to inputs)."""
        with self._lock:
            return dict(self._held)


@dataclass(frozen=True)
class Fencing:
    """The fenced store that keeps the epochs, and the epochs this worker holds."""

    store: StateStore
    fence: EpochFence = field(default_factory=EpochFence)

    def take(self, partitions: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Take the next epoch of each newly assigned partition; answers the moved ones.

        If the store cannot answer, nothing is held any more (every guarded
        write is refused) and the error goes on to fail the stream.
        """
        wanted = sorted(partitions)
        try:
            epochs = retrying("take epochs", lambda: self.store.take_epochs(wanted))
        except Exception:
            self.fence.assign({})
            raise
        moved = self.fence.assign(epochs)
        log.info("epochs taken: %s%s", epochs, f"; moved meanwhile: {sorted(moved)}"
                 if moved else "")
        return moved
