"""Fencing: a write carries the epochs of the input partitions it depends on.

Each assignment takes ONE new epoch from the pipeline's counter in the store
and sets it as the epoch of every partition assigned, answering each one's
previous epoch, all atomically. Epochs are therefore ordered across
partitions: any successor's epoch is greater than every epoch a zombie holds,
which lets Cassandra order writes by epoch (``write_timestamp``). A worker
remembers the epochs it took, and a store write that depends on a partition
(states and history rows folded from its records, outbox rows) passes them as
a ``Guard``; the store checks every one against what it holds (atomically
with the write on Redis; on Cassandra just before it, with the write
timestamps ordering what slips between), and refuses the whole write if any
differs. A worker that lost a partition (its session expired while it was
paused, and another member took the partition under a new epoch) can then no
longer overwrite the new owner's rows: its write is refused as if it had
crashed just before it (docs/architecture.md, "Fencing").

This module holds what every store shares (``Guard``, ``Taken``, ``Fenced``); each
backend's taking and checking is in ``redis_fence`` and ``cassandra_fence``, and the
epochs a worker holds, with the checks its writers make, in ``held_epochs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from onceflow.shared_types import TopicPartition

#: The epochs a write depends on: input partition -> the epoch its writer holds.
Guard = Mapping[TopicPartition, int]

#: Every fenced write timestamp is above this (microseconds: year 2112), so
#: above every row written before with the driver's clock (~1.7e15 today).
TIMESTAMP_BASE = 2**52
#: Writes per epoch and store client before ``write_timestamp`` would reach the next epoch.
WRITES_PER_EPOCH = 2**32
#: The counter's row and key name ('#' never appears in a Kafka topic name).
COUNTER = "#counter"


@dataclass(frozen=True)
class Taken:
    """One assignment's epoch, and the epoch each partition had before it."""

    epoch: int
    previous: Mapping[TopicPartition, int | None]

    @property
    def guard(self) -> Guard:
        """The guard of a write depending on every partition taken."""
        return {tp: self.epoch for tp in self.previous}


def write_timestamp(epoch: int, sequence: int) -> int:
    """The Cassandra write timestamp of a store client's ``sequence``-th write under ``epoch``.

    Cassandra keeps the cell with the highest timestamp, so a write under a
    lower epoch (a zombie's) never replaces one under a higher epoch,
    whatever the order they arrive in; within an epoch one client's writes
    keep their order.
    """
    if not 0 <= sequence < WRITES_PER_EPOCH:
        raise ValueError(f"write sequence {sequence} out of range for one epoch")
    stamp = TIMESTAMP_BASE + (epoch << 32) + sequence
    if epoch < 0 or stamp >= 2**63:
        raise ValueError(f"epoch {epoch} out of range for a write timestamp")
    return stamp


class Fenced(RuntimeError):
    """A write was refused: the store holds another epoch for a partition it depends on.

    Not transient: retrying cannot succeed, and the worker must drop what it
    holds of the partition (its in-memory states are older than the store's).
    """

    def __init__(self, partition: TopicPartition, held: int | None, stored: int | None):
        self.partition, self.held, self.stored = partition, held, stored
        topic, number = partition
        if held is None:
            why = "this worker holds no epoch of it (not assigned here, or moved meanwhile)"
        else:
            why = f"this worker holds epoch {held}, the store has {stored}: another worker " \
                  "took it over"
        super().__init__(f"write fenced: {topic}[{number}]: {why}")


def first_mismatch(guard: Guard, stored: Mapping[TopicPartition, int | None]
                   ) -> Fenced | None:
    """The refusal for the first partition (in sorted order) whose stored epoch differs."""
    for tp in sorted(guard):
        if stored.get(tp) != guard[tp]:
            return Fenced(tp, guard[tp], stored.get(tp))
    return None


def epoch_key(base: str, partition: TopicPartition) -> str:
    """The store key of a partition's epoch: ``<base>:epoch:<topic>|<partition>``."""
    topic, number = partition
    return f"{base}:epoch:{topic}|{number}"
