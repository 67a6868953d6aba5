"""The epochs this worker holds for its input partitions (docs/architecture.md, "Fencing").

Shared by the consumer (which takes new epochs on each assignment), the
persistence (which guards a snapshot's writes with the epochs of the
partitions the snapshot depends on), the outbox writer (guarded with every
held epoch) and the producer (``OutputFence``: it checks the epochs of a
batch's input partitions before producing its exclusive outputs). Pure
bookkeeping under a lock; the store calls are the callers'.

A partition whose previous epoch (the store answers it with the new one) is
not the last one taken here was taken by another worker in between, so what
this worker still holds of it in memory may be older than the store: the
partition is *moved*. Its new epoch is kept back until the caller has
forgotten that progress (``release``), so no write of the old progress can
pass under the new epoch meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from onceflow import faults
from onceflow.stages.outcome import Output
from onceflow.stages.state import TopicPartition
from onceflow.stores.base import StateStore
from onceflow.stores.fencing import Fenced, Guard, Taken
from onceflow.stores.retry import retrying

log = logging.getLogger(__name__)


class EpochFence:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[TopicPartition, int] = {}  # writable under these epochs
        self._kept_back: dict[TopicPartition, int] = {}  # moved: until released
        self._last: dict[TopicPartition, int] = {}  # the last epoch taken here, ever

    def assign(self, taken: Taken) -> set[TopicPartition]:
        """A new assignment with the epochs just taken; answers the moved partitions.

        Partitions not taken are no longer held: a write depending on them is
        refused from now on.
        """
        with self._lock:
            epochs = taken.guard
            moved = {tp for tp, previous in taken.previous.items()
                     if tp in self._last and previous != self._last[tp]}
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
    """The fenced store that keeps the epochs, the epochs this worker holds, and the
    pipeline's other fenced stores (their rows are ordered by these epochs too)."""

    store: StateStore
    fence: EpochFence = field(default_factory=EpochFence)
    others: tuple[StateStore, ...] = ()

    def take(self, partitions: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Take one new epoch for the assigned partitions; answers the moved ones.

        If the store cannot answer, nothing is held any more (every guarded
        write is refused) and the error goes on to fail the stream.
        """
        wanted = sorted(partitions)
        try:
            epochs = retrying("take epochs", lambda: self._take(wanted))
        except Exception:
            self.fence.assign(Taken(0, {}))
            raise
        moved = self.fence.assign(epochs)
        log.info("epoch %d taken for %s%s", epochs.epoch, sorted(epochs.previous),
                 f"; moved meanwhile: {sorted(moved)}" if moved else "")
        return moved

    def _take(self, wanted: list[TopicPartition]) -> Taken:
        """Above every epoch the other stores' rows may carry (their counters), and those
        counters raised to it: if the pipeline's stores change, its epochs still grow."""
        if not wanted:
            return Taken(0, {})
        floor = max((other.raise_counter(0) for other in self.others), default=0)
        taken = self.store.take_epochs(wanted, floor)
        for other in self.others:
            other.raise_counter(taken.epoch)
        return taken


#: Seconds after which a check is repeated right before a produce request is written: the
#: records waited (behind a slow broker), or the whole process was paused in between.
RECHECK_AFTER = 1.0


@dataclass(frozen=True)
class OutputFence:
    """The check before exclusive outputs (exclusive republish, dead letters, late events)
    are produced: this worker still holds the epochs of the input partitions they come
    from, in the store that keeps them (one read per batch, not per record).

    Kafka cannot refuse a zombie's records as the store refuses its states, so a
    worker paused past its session timeout would, once thawed, write what it had in
    hand after its successor read the outputs' tails: copies in topics promised to be
    written once. Fenced, the producer drops those records and fails its incarnation
    (docs/architecture.md, "Fencing").
    """

    store: StateStore
    fence: EpochFence
    topics: frozenset[str]

    def wanted(self, outputs: Iterable[Output]) -> bool:
        """Whether a batch holds an exclusive output (and the check is on)."""
        topics = self.topics
        return not faults.NO_FENCING and any(o.topic in topics for o in outputs)

    def check(self, depends: Iterable[TopicPartition]) -> Guard:
        """The guard of ``depends``, checked against the store; raise ``Fenced`` if one is
        no longer held here or there."""
        guard = self.fence.expect(depends)
        self.recheck(guard)
        return guard

    def recheck(self, guard: Guard) -> None:
        """Check ``guard`` against the store again (a batch that waited)."""
        if not guard:
            return
        try:  # once without tenacity's per-call set-up (a tenth of the check's cost)
            self.store.check_epochs(guard)
        except Fenced:
            raise
        except Exception:  # transient ones retried with backoff, the others re-raised
            retrying("check epochs", lambda: self.store.check_epochs(guard))


def epoch_source(stores: Iterable[StateStore]) -> StateStore | None:
    """The one store that keeps a pipeline's epochs: the first whose check is atomic with
    its writes (Redis), else the first fenced one (Cassandra); None if none is fenced.

    Every other fenced store is told ``epochs_elsewhere``: it orders writes by the
    guards' epochs without checking them against epochs it does not hold.
    """
    fenced = [store for store in stores if store.fenced]
    return next((store for store in fenced if store.atomic_fence),
                fenced[0] if fenced else None)


def share_epochs(source: StateStore | None, stores: Iterable[StateStore | None]
                 ) -> tuple[StateStore, ...]:
    """Tell every fenced store but those of the source's kind that the epochs are
    elsewhere; answers them."""
    told = tuple(store for store in stores if source is not None and store is not None
                 and store.fenced and not store.atomic_fence and type(store) is not type(source))
    for store in told:
        store.epochs_elsewhere()
    return told
