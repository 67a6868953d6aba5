"""Offset continuity per partition: notice a hole in what a fetch returned.

A broker that assigns offsets before it has written the batch (Tansu does)
can answer a fetch with later batches while an earlier one is still being
written. The client then moves its position past the missing records, and
a consumer tailing the partition would never see them. Real Kafka only
leaves holes that stay: compacted records, transaction markers, aborted
batches. So a hole is first re-fetched (a few times, after a short pause),
and accepted only when it persists.

A hole the fetch itself explains is no loss and is passed without a re-fetch:
offsets the broker served in batches the client skips on purpose (a transaction's
commit or abort marker, an aborted transaction's records under read_committed),
which ``skipped_batches`` notes and the caller passes as ``explained``.

A partition can also move the other way: its records restart *below* the
offset this worker's group committed, when the topic was deleted and
re-created under its name, or truncated (an unclean leader election). The
client then resets to the earliest offset on its own, and every new record
would sit below the watermarks its predecessors left: each one discarded as
a copy, silently. So a record below the position a partition was assigned
at stops the worker with ``PartitionRewound`` instead. A broker may also
just serve nothing there (Tansu answers a fetch beyond the log's end with
an empty batch, not an out-of-range error): a high watermark that stays
below the expected offset for ``rewind_grace`` seconds stops it too (a real
Kafka's watermark may lag a moment after a leader change, hence the grace).

Pure logic, no I/O: the consumer asks :meth:`Continuity.check` about each
partition's fetched records and acts on the :class:`Verdict`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from onceflow.stages.state import TopicPartition

#: Whether the offsets ``first`` to ``last`` of the partition checked were served in
#: batches the client skipped on purpose (``skipped_batches.SkippedRanges.covers``).
Explained = Callable[[int, int], bool]


class HasOffset(Protocol):
    """A fetched record, as far as continuity cares (aiokafka's ConsumerRecord)."""

    @property
    def offset(self) -> int: ...


@dataclass(frozen=True)
class GapCheck:
    """``onceflow.consumer.gap-*``: re-fetches of a hole before it is accepted (0: none),
    the pause before each, and ``rewind-grace`` (see the module doc)."""

    refetches: int = 0
    backoff: float = 0.0
    rewind_grace: float = 30.0


class PartitionRewound(RuntimeError):
    """A partition's log restarted below the offset this worker's group had reached."""

    def __init__(self, tp: TopicPartition, committed: int, found: int, ends: bool = False):
        served = f"ends at offset {found}" if ends else f"served offset {found}"
        super().__init__(
            f"{tp[0]}[{tp[1]}] {served}, below offset {committed} that this consumer group "
            f"had reached: the topic was deleted and re-created (or truncated). "
            f"Its new records would sit below the watermarks of the old ones and be "
            f"discarded as copies, so the worker stops. Give the new topic a new name; or, "
            f"if it was re-created and its events are new, stop every worker of the "
            f"pipeline and run `onceflow forget --topic {tp[0]} -c <app.conf>`; or start "
            f"over with a new pipeline id and consumer group "
            f"(docs/guide/operations-and-health.md: \"A log that restarts below the "
            f"group's offset\")")
        self.tp, self.committed, self.found = tp, committed, found


class Verdict(NamedTuple):
    """What to do with one partition's fetched records.

    Attributes:
        deliver: how many records, from the first, to deliver now.
        refetch_from: when set, seek the partition here and fetch again
            (after a pause); the records after ``deliver`` are dropped.
        accepted: the missing offsets ``(first, last)`` of a hole given up
            on in this call (it persisted through every allowed re-fetch).
    """

    deliver: int
    refetch_from: int | None = None
    accepted: tuple[int, int] | None = None


class Continuity:
    """The next expected offset of each partition, and re-fetches spent on its hole.

    Args:
        refetches: re-fetches of one hole (at one expected offset) before it
            is accepted; 0 accepts a hole on sight (still logged and counted).

    A partition without an expected offset (not announced by :meth:`expect`)
    is tracked from the first record fetched for it.
    """

    def __init__(self, refetches: int, rewind_grace: float = 30.0) -> None:
        if refetches < 0:
            raise ValueError(f"refetches must be at least 0, got {refetches}")
        self._limit = refetches
        self._next: dict[TopicPartition, int] = {}
        self._spent: dict[TopicPartition, int] = {}
        self._floor: dict[TopicPartition, int] = {}  # the position at assignment
        self._grace = rewind_grace
        self._short_since: dict[TopicPartition, float] = {}  # watermark below expected since

    def expect(self, tp: TopicPartition, offset: int) -> None:
        """The next record of ``tp`` must be ``offset`` (its position at assignment); none
        may ever be below it."""
        self._next[tp] = self._floor[tp] = offset
        self._spent.pop(tp, None)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Stop tracking ``tps`` (revoked)."""
        for tp in tps:
            self._next.pop(tp, None)
            self._spent.pop(tp, None)
            self._floor.pop(tp, None)
            self._short_since.pop(tp, None)

    def ends_at(self, tp: TopicPartition, highwater: int, now: float) -> None:
        """The broker says ``tp`` ends at ``highwater`` (a fetch's answer, at time ``now``):
        ``PartitionRewound`` once it has stayed below the expected offset for the grace."""
        expected = self._next.get(tp)
        if expected is None or highwater >= expected:
            self._short_since.pop(tp, None)
            return
        since = self._short_since.setdefault(tp, now)
        if now - since >= self._grace:
            raise PartitionRewound(tp, expected, highwater, ends=True)

    def expected(self, tp: TopicPartition) -> int | None:
        return self._next.get(tp)

    def check(self, tp: TopicPartition, records: Sequence[HasOffset],
              explained: Explained | None = None) -> Verdict:
        """Judge ``records`` (one partition's, in offset order, non-empty).

        Dense records (the normal case) cost two comparisons. A hole that
        ``explained`` covers is passed (no re-fetch, not reported). Records below
        the expected offset are delivered as they are (a replay the
        watermarks discard) and re-anchor the tracking, unless they are below
        the assigned position: ``PartitionRewound``.
        """
        first, count = records[0].offset, len(records)
        expected = self._next.get(tp, first)
        if first == expected and records[-1].offset - first == count - 1:
            self._next[tp] = first + count
            if self._spent:
                self._spent.pop(tp, None)
            return Verdict(count)
        return self._walk(tp, records, expected, explained)

    def _walk(self, tp: TopicPartition, records: Sequence[HasOffset], expected: int,
              explained: Explained | None) -> Verdict:
        floor = self._floor.get(tp)
        if floor is not None and records[0].offset < floor:
            raise PartitionRewound(tp, floor, records[0].offset)
        accepted: tuple[int, int] | None = None
        for index, record in enumerate(records):
            offset = record.offset
            if offset > expected and (explained is None
                                      or not explained(expected, offset - 1)):
                spent = self._spent.get(tp, 0)
                if spent < self._limit:
                    self._spent[tp] = spent + 1
                    self._next[tp] = expected
                    return Verdict(index, expected, accepted)
                accepted = (expected, offset - 1)
            self._spent.pop(tp, None)
            expected = offset + 1
        self._next[tp] = expected
        return Verdict(len(records), None, accepted)
