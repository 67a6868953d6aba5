"""Offset continuity per partition: notice a hole in what a fetch returned.

A broker that assigns offsets before it has written the batch (Tansu does)
can answer a fetch with later batches while an earlier one is still being
written. The client then moves its position past the missing records, and
a consumer tailing the partition would never see them. Real Kafka only
leaves holes that stay: compacted records, transaction markers, aborted
batches. So a hole is first re-fetched (a few times, after a short pause),
and accepted only when it persists.

Pure logic, no I/O: the consumer asks :meth:`Continuity.check` about each
partition's fetched records and acts on the :class:`Verdict`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

from onceflow.stages.state import TopicPartition


class HasOffset(Protocol):
    """A fetched record, as far as continuity cares (aiokafka's ConsumerRecord)."""

    @property
    def offset(self) -> int: ...


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
            is accepted; at least 1 (a consumer that does not want the check
            does not build this object).

    A partition without an expected offset (not announced by :meth:`expect`)
    is tracked from the first record fetched for it.
    """

    def __init__(self, refetches: int) -> None:
        if refetches < 1:
            raise ValueError(f"refetches must be at least 1, got {refetches}")
        self._limit = refetches
        self._next: dict[TopicPartition, int] = {}
        self._spent: dict[TopicPartition, int] = {}

    def expect(self, tp: TopicPartition, offset: int) -> None:
        """The next record of ``tp`` must be ``offset`` (its position at assignment)."""
        self._next[tp] = offset
        self._spent.pop(tp, None)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Stop tracking ``tps`` (revoked)."""
        for tp in tps:
            self._next.pop(tp, None)
            self._spent.pop(tp, None)

    def expected(self, tp: TopicPartition) -> int | None:
        return self._next.get(tp)

    def check(self, tp: TopicPartition, records: Sequence[HasOffset]) -> Verdict:
        """Judge ``records`` (one partition's, in offset order, non-empty).

        Dense records (the normal case) cost two comparisons. Records below
        the expected offset are delivered as they are (a replay the
        watermarks discard) and re-anchor the tracking.
        """
        first, count = records[0].offset, len(records)
        expected = self._next.get(tp, first)
        if first == expected and records[-1].offset - first == count - 1:
            self._next[tp] = first + count
            if self._spent:
                self._spent.pop(tp, None)
            return Verdict(count)
        return self._walk(tp, records, expected)

    def _walk(self, tp: TopicPartition, records: Sequence[HasOffset], expected: int) -> Verdict:
        accepted: tuple[int, int] | None = None
        for index, record in enumerate(records):
            offset = record.offset
            if offset > expected:
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
