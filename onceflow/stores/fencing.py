"""Fencing: a write carries the epochs of the input partitions it depends on.

Each assignment of an input partition takes the next *epoch* of that
partition in the store (an atomic increment). A worker remembers the epochs it
took, and a store write that depends on a partition (states and history rows
folded from its records, outbox rows) passes them as a ``Guard``; the store
checks every one against what it holds, atomically with the write, and
refuses the whole write if any differs. A worker that lost a partition (its
session expired while it was paused, and another member took the partition
and its next epoch) can then no longer overwrite the new owner's rows: its
write is refused as if it had crashed just before it (docs/architecture.md,
"Fencing").
"""

from __future__ import annotations

from collections.abc import Mapping

from onceflow.stages.state import TopicPartition

#: The epochs a write depends on: input partition -> the epoch its writer holds.
Guard = Mapping[TopicPartition, int]


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
