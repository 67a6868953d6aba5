"""Epochs on Cassandra: taken with one conditional batch, checked with one read.

All epochs of a pipeline live in one Cassandra partition of the ``epochs``
table: the counter (row ``#counter``) and one row per input partition
(``<topic>|<partition>``). Taking reads them (SERIAL) and writes the counter
and every partition's row in one conditional batch (a lightweight
transaction; in one partition, so atomic): each row is updated only if it
still holds what was read (``IF value = ?``, or ``IF NOT EXISTS`` for a row
never written). If another worker took epochs in between, the batch is not
applied and taking starts again, after a random pause. A batch that timed out
may still have been applied: taking again (the worker retries) then answers the
next epoch, and the timed-out one is held by nobody, which fencing allows (an
epoch only has to be unique and growing). Every epoch set is the counter's new value,
so a partition's epoch only grows and any successor's epoch is greater than
every epoch a zombie holds.

A Cassandra write cannot test a row of another partition, so the check before
a guarded write is a separate read; what slips between that read and the
write is ordered by the write timestamps (``onceflow.stores.fencing.
write_timestamp``): a zombie's late row never replaces its successor's.

Every state, history and producer-sequence row is written ``USING TIMESTAMP``
2**52 + (epoch << 32) + n: the guard's highest epoch, n counting this client's
writes (``WriteClock``). A write without a guard takes the highest epoch this
client has seen, never the driver's clock (which would lose against every
fenced row). State rows are never deleted: a tombstone would need the same
timestamps (a state that expires, ``USING TTL``, lapses under its own timestamp). When
the pipeline's epochs are kept in Redis (the store's ``epochs_elsewhere``), the
timestamps alone order the writes, with no check here. Outbox rows are checked, not
timestamped: their deletes use the driver's clock, and must win.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.query import BatchStatement, PreparedStatement, Statement

from onceflow import faults
from onceflow.shared_types import TopicPartition
from onceflow.stores.fencing import COUNTER, Guard, Taken, first_mismatch, write_timestamp

#: Attempts of a take that keep meeting other workers' takes (each one of them won).
TAKE_ATTEMPTS = 100
#: The longest pause after a lost compare-and-set (seconds): random up to it, growing.
MAX_CONTENTION_PAUSE = 0.2

Run = Callable[[Statement | PreparedStatement, tuple[Any, ...] | None], list[tuple[Any, ...]]]


class EpochsContended(ConnectionError):
    """Other workers' takes kept winning; transient (a ``ConnectionError``): retried."""


def contention_pause(attempt: int) -> None:
    """Wait a random while after losing a compare-and-set, longer each time: takers that
    retry at once keep colliding, and Cassandra answers contended Paxos rounds with
    timeouts (full jitter)."""
    time.sleep(random.uniform(0.0, min(MAX_CONTENTION_PAUSE, 0.005 * 2 ** attempt)))


def row_name(partition: TopicPartition) -> str:
    """A partition's row: ``<topic>|<partition>``."""
    topic, number = partition
    return f"{topic}|{number}"


class CassandraFence:
    """The epochs of one pipeline in ``"<keyspace>".<table>``; ``run`` executes a statement
    (turning the driver's transient errors into the store's)."""

    def __init__(self, session: Session, table: str, pipeline: str, run: Run) -> None:
        self._pipeline, self._run = pipeline, run
        self._read = session.prepare(
            f"SELECT name, value FROM {table} WHERE pipeline = ? AND name IN ?")
        self._read.is_idempotent = True
        self._serial_read = session.prepare(
            f"SELECT name, value FROM {table} WHERE pipeline = ? AND name IN ?")
        self._serial_read.consistency_level = ConsistencyLevel.SERIAL
        self._serial_read.is_idempotent = True
        self._update = session.prepare(
            f"UPDATE {table} SET value = ? WHERE pipeline = ? AND name = ? IF value = ?")
        self._insert = session.prepare(
            f"INSERT INTO {table} (pipeline, name, value) VALUES (?, ?, ?) IF NOT EXISTS")

    def take(self, partitions: Sequence[TopicPartition], floor: int = 0) -> Taken:
        """One new epoch above ``floor`` for every partition, and their previous epochs,
        atomically."""
        if not partitions:
            return Taken(0, {})
        names = [COUNTER, *(row_name(tp) for tp in partitions)]
        for attempt in range(TAKE_ATTEMPTS):
            stored = self._values(self._serial_read, names)
            epoch = max(stored.get(COUNTER) or 0, floor) + 1
            batch = BatchStatement(serial_consistency_level=ConsistencyLevel.SERIAL)
            for name in names:
                old = stored.get(name)
                if old is None:
                    batch.add(self._insert, (self._pipeline, name, epoch))
                else:
                    batch.add(self._update, (epoch, self._pipeline, name, old))
            answer = self._run(batch, None)
            if answer and answer[0][0]:  # [applied]
                return Taken(epoch, {tp: stored.get(row_name(tp)) for tp in partitions})
            contention_pause(attempt)
        raise EpochsContended(f"epochs not taken: other workers' takes won {TAKE_ATTEMPTS} "
                              "times in a row")

    def raise_counter(self, epoch: int) -> int:
        """Raise the counter to at least ``epoch`` (compare-and-set); answer what it was."""
        for attempt in range(TAKE_ATTEMPTS):
            counter = self._values(self._serial_read, [COUNTER]).get(COUNTER)
            if counter is not None and counter >= epoch:
                return counter
            answer = self._run(self._insert, (self._pipeline, COUNTER, epoch)) \
                if counter is None else \
                self._run(self._update, (epoch, self._pipeline, COUNTER, counter))
            if answer and answer[0][0]:
                return counter or 0
            contention_pause(attempt)
        raise EpochsContended(f"epoch counter not raised to {epoch}: other workers' takes won "
                              f"{TAKE_ATTEMPTS} times in a row")

    def check(self, guard: Guard) -> None:
        """Raise ``Fenced`` unless every epoch of ``guard`` is the stored one (one read)."""
        if not guard:
            return
        stored = self._values(self._read, [row_name(tp) for tp in guard])
        mismatch = first_mismatch(guard, {tp: stored.get(row_name(tp)) for tp in guard})
        if mismatch is not None:
            raise mismatch

    def _values(self, statement: PreparedStatement, names: list[str]) -> dict[str, int]:
        return {name: int(value) for name, value in self._run(statement, (self._pipeline, names))}


class WriteClock:
    """The write timestamps of one store client, ordered by epoch first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0  # the highest epoch of a guard or a take here
        self._writes = 0

    def saw(self, epoch: int) -> None:
        with self._lock:
            self._epoch = max(self._epoch, epoch)

    def next(self, guard: Guard | None) -> int:
        """Under the guard's highest epoch, else under the highest seen here."""
        if faults.NO_FENCING:  # as before fencing: the clock orders the writes
            return time.time_ns() // 1000
        with self._lock:
            epoch = max(guard.values()) if guard else self._epoch
            self._epoch = max(self._epoch, epoch)
            self._writes += 1
            return write_timestamp(epoch, self._writes)
