"""One interface for every state store: encoded states in, encoded states out.

Stores see opaque bytes (a state and its watermarks, encoded together by
``onceflow.stages.state``), so one ``save`` of a key is one atomic write of
the state with its watermarks whatever the backend.

Each store also keeps its pipeline's producer outbox: records that must
reach Kafka but whose delivery is not yet acknowledged, so a restarted
worker sends them again instead of losing them.

The interface is split by concern into small protocols, one per thing a caller
needs: ``StateRows`` (a stage's rows), ``HistoryRows`` (closed windows),
``KeyHomes``, ``EpochCounter`` (fencing), ``Outbox``, ``Stats`` and ``Connection``.
A caller's hint names only the ones it uses, so a test double implements those
alone. ``StateStore`` is all of them: the base class of the Redis and Cassandra
stores, with the defaults a store may keep.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from onceflow.shared_types import TopicPartition
from onceflow.stores.fencing import Guard, Taken

__all__ = ["HISTORY_SUFFIX", "Connection", "EpochCounter", "HistoryRows", "KeyHomes", "Outbox",
           "OutboxKey", "StateRows", "StateStore", "Stats", "UndecodableState"]

# History rows live beside the states under "<stage>#history" ('#' never
# appears in a stage id), so every store supports them through save/scan.
HISTORY_SUFFIX = "#history"

#: (lane, seq): a lane names one output topic-partition (e.g. "orders|3", so
#: it may contain '|'); seq orders the records within a lane.
OutboxKey = tuple[str, int]


class UndecodableState(ValueError):
    """A row in the store that is no state onceflow wrote (garbage written by hand, another
    program, a damaged copy): no restart can fix it, so the worker stops, naming the stage,
    the key and the row for an operator to repair or delete."""

    def __init__(self, stage_id: str, key: str, row: str, error: BaseException):
        super().__init__(f"the stored state of stage {stage_id!r}, key {key!r} cannot be "
                         f"decoded ({error}); its row: {row}; repair or delete that row, "
                         "then start the worker again")
        self.stage_id, self.key, self.row = stage_id, key, row


class StateRows(Protocol):
    """A pipeline's per-key rows, namespaced by stage id: states and the runtime's own."""

    @abstractmethod
    def load(self, stage_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Batched read; keys never written are absent from the result."""

    @abstractmethod
    def save(self, stage_id: str, rows: Mapping[str, bytes], *, guard: Guard | None = None
             ) -> None:
        """Write every row; each row is written atomically on its own.

        With a ``guard``, a fenced store writes nothing and raises ``Fenced`` unless it
        holds exactly those epochs, checked atomically with the write.
        """

    @abstractmethod
    def scan(self, stage_id: str) -> Iterator[tuple[str, bytes]]:
        """Every row of a stage (for verification and analytics, not the hot path)."""

    @abstractmethod
    def row_name(self, stage_id: str, key: str) -> str:
        """Where ``load(stage_id, [key])`` reads, as an operator would find it."""


class HistoryRows(Protocol):
    """Closed windows, final: written once, never read back by the worker.

    ``history_retention`` (seconds, 0 keeps forever) makes history rows, and only
    them, expire that long after their last write. What keeps a closed window from
    being folded or closed again is its key's state (watermarks and ``max_ts``),
    which expires only under ``expire_after``, once its last window closed (the
    stage's watermark then still makes an older value late).
    """

    history_retention: float

    @abstractmethod
    def save_history(self, stage_id: str, rows: Mapping[tuple[str, int], bytes], *,
                     guard: Guard | None = None) -> None:
        """Write closed windows, (key, window start ms) -> final value; idempotent."""

    @abstractmethod
    def scan_history(self, stage_id: str) -> Iterator[tuple[str, int, bytes]]:
        """Every closed window of a stage as (key, window start ms, final value)."""

    @abstractmethod
    def save_expiring(self, stage_id: str, rows: Mapping[str, bytes], ttl: float, *,
                      guard: Guard | None = None) -> None:
        """Like ``save``, each row expiring ``ttl`` seconds (> 0) after this write."""


class KeyHomes(Protocol):
    """Which input partition feeds each key's state, when several workers run a pipeline."""

    @abstractmethod
    def claim_homes(self, stage_id: str, proposals: Mapping[str, str]) -> dict[str, str]:
        """Set each key's home to the proposed one unless it has one; answer every key's home.

        Atomic per key across workers: of two workers proposing different
        homes for a new key, exactly one wins and both are told the winner.
        A home, once set, never changes.
        """


class EpochCounter(Protocol):
    """The pipeline's epochs, which fence a worker that lost its partitions
    (``onceflow.stores.fencing``)."""

    #: Whether writes given a ``guard`` check it; a store that does not ignores it.
    fenced: bool
    #: Whether the check is atomic with the write (Redis): such a store is preferred as the
    #: pipeline's one source of epochs (``onceflow.stores.fencing.held_epochs.epoch_source``).
    atomic_fence: bool

    @abstractmethod
    def take_epochs(self, partitions: Sequence[TopicPartition], floor: int = 0) -> Taken:
        """One new epoch from the pipeline's counter (and above ``floor``) for all
        ``partitions``, with each one's previous epoch, atomically (a fenced store only)."""

    @abstractmethod
    def check_epochs(self, guard: Guard) -> None:
        """Raise ``Fenced`` unless the store holds exactly these epochs (a fenced store only)."""

    @abstractmethod
    def epochs_elsewhere(self) -> None:
        """The pipeline's epochs are kept in another store: order writes by the guards'
        epochs, without checking them here (a fenced store whose check is not atomic)."""

    @abstractmethod
    def raise_counter(self, epoch: int) -> int:
        """Raise the pipeline's epoch counter here to at least ``epoch``; answer what it was.

        For a store whose rows are ordered by epochs taken elsewhere: should it keep
        the epochs one day (the pipeline's stores changed), its epochs start above.
        """


class Outbox(Protocol):
    """Records produced but not yet acknowledged by Kafka, kept so a crash cannot lose them."""

    @abstractmethod
    def outbox_append(self, rows: Mapping[OutboxKey, bytes], *, guard: Guard | None = None
                      ) -> None:
        """Durably keep records not yet delivered (opaque bytes), so a crash cannot lose them.

        Idempotent: writing the same key and value again (a retry) is fine.
        """

    @abstractmethod
    def outbox_remove(self, keys: Sequence[OutboxKey]) -> None:
        """Forget delivered records; absent keys are ignored, so a retry is fine."""

    @abstractmethod
    def outbox_load(self) -> dict[str, list[tuple[int, bytes]]]:
        """This pipeline's whole outbox, lane -> [(seq, record)] by ascending seq.

        For recovery: a restarted worker resends each lane in its original order.
        """


class Stats(Protocol):
    """The pipeline's running counters (best effort, for reports)."""

    @abstractmethod
    def add_stats(self, counters: Mapping[str, int]) -> None:
        """Add to the pipeline's running counters."""

    @abstractmethod
    def read_stats(self) -> dict[str, int]:
        """Every counter's total."""


class Connection(Protocol):
    """The store's client: checked before a worker starts, closed at its end."""

    @abstractmethod
    def check_access(self) -> Exception | None:
        """Connect once: None if the store let us in, else why it did not answer.

        Raises ``onceflow.stores.access.StoreAccessDenied`` if it refused the
        credentials, certificate or a permission: checked before a worker
        starts, so that a wrong password stops it with a configuration error.
        """

    def durability(self) -> tuple[int, str] | None:
        """What the store keeps of a write it acknowledged, as (logging level, message)
        for the start-up log; None when there is nothing to check at run time."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the client's connections."""


class StateStore(StateRows, HistoryRows, KeyHomes, EpochCounter, Outbox, Stats, Connection, ABC):
    """Every concern of one pipeline's store; the base of the Redis and Cassandra stores.

    A store implements ``load``, ``save``, ``scan``, ``claim_homes``, the outbox, the
    stats and ``close``; the rest has a default here: history rows beside the states
    under ``<stage>#history`` through ``save``/``scan``, no expiry, no fencing.
    """

    history_retention: float = 0.0
    fenced: bool = False
    atomic_fence: bool = False

    def row_name(self, stage_id: str, key: str) -> str:
        return f"{type(self).__name__} stage {stage_id!r} key {key!r}"

    def save_history(self, stage_id: str, rows: Mapping[tuple[str, int], bytes], *,
                     guard: Guard | None = None) -> None:
        encoded = {f"{start}|{key}": value for (key, start), value in rows.items()}
        if self.history_retention:
            self.save_expiring(stage_id + HISTORY_SUFFIX, encoded, self.history_retention,
                               guard=guard)
        else:
            self.save(stage_id + HISTORY_SUFFIX, encoded, guard=guard)

    def save_expiring(self, stage_id: str, rows: Mapping[str, bytes], ttl: float, *,
                      guard: Guard | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot expire rows")

    def scan_history(self, stage_id: str) -> Iterator[tuple[str, int, bytes]]:
        for name, value in self.scan(stage_id + HISTORY_SUFFIX):
            start, _, key = name.partition("|")
            yield key, int(start), value

    def take_epochs(self, partitions: Sequence[TopicPartition], floor: int = 0) -> Taken:
        raise NotImplementedError(f"{type(self).__name__} is not fenced")

    def check_epochs(self, guard: Guard) -> None:
        raise NotImplementedError(f"{type(self).__name__} is not fenced")

    def epochs_elsewhere(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} checks the epochs it holds")

    def raise_counter(self, epoch: int) -> int:
        raise NotImplementedError(f"{type(self).__name__} checks the epochs it holds")

    def check_access(self) -> Exception | None:
        return None
