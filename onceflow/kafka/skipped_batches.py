"""Offsets a fetch served in batches the fetcher skips on purpose: transaction markers and
aborted transactions.

aiokafka's fetcher (``PartitionRecords._unpack_records``) never returns a control batch
(a transaction's commit or abort marker, one offset each) and, under read_committed,
skips the batches of aborted transactions; it moves the position past them. To the
continuity check (``continuity``) those offsets look like a hole a lost fetch leaves,
and each would cost ``gap-refetches`` re-fetches and a warning. Yet they are no loss:
the broker served them. ``install()`` has each fetch note the offsets of its control
and transactional batches (the ones the fetcher may skip whole) in the partition's
:class:`SkippedRanges`, kept on aiokafka's state of that partition in that consumer's
assignment (it goes with the assignment); ``FetchContinuity`` asks it about a hole
before re-fetching. A committed transaction's batches are noted too: their records are
delivered, so no hole ever falls there. A hole no served batch covers (Tansu's batch
written late, a compacted-away batch) is still re-fetched.

Two seams, one call per batch and none per record: the fetch's records object is
``NotedRecords`` (``tolerant_records.KeptRecords`` with ``next_batch`` noting), and
``FetchResult.__init__`` hands it the partition's ranges. After a fetch was parsed again
for a header name that is not UTF-8 (``tolerant_records``), its later batches are not
noted: a marker there costs a re-fetch, as before. Tested with aiokafka 0.14.0;
``tests/unit/test_skipped_batches.py`` fails if a seam moves.
"""

from __future__ import annotations

import bisect
import inspect
import logging
from typing import Any

import aiokafka.consumer.fetcher as fetcher
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition

from onceflow.kafka import tolerant_records
from onceflow.kafka.tolerant_records import KeptRecords

log = logging.getLogger(__name__)

#: aiokafka's own ``FetchResult.__init__``, which ``_result_init`` calls.
AIOKAFKA_RESULT_INIT = fetcher.FetchResult.__init__
_ATTR = "onceflow_skipped"  # the SkippedRanges on aiokafka's TopicPartitionState
LIMIT = 1024  # ranges kept per partition; beyond it the lowest go (a re-fetch at worst)


class SkippedRanges:
    """Offset ranges ``(first, last)`` served in skippable batches: ascending, disjoint,
    adjacent ones merged, at most ``LIMIT``."""

    __slots__ = ("_firsts", "_lasts")

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []

    def add(self, first: int, last: int) -> None:
        firsts, lasts = self._firsts, self._lasts
        if not lasts or first > lasts[-1] + 1:  # the usual case: after everything noted
            firsts.append(first)
            lasts.append(last)
        else:  # touches or precedes what is noted (a re-fetch serves it again)
            i = bisect.bisect_left(lasts, first - 1)
            j = bisect.bisect_right(firsts, last + 1)
            if i < j:
                first, last = min(first, firsts[i]), max(last, lasts[j - 1])
                del firsts[i:j], lasts[i:j]
            firsts.insert(i, first)
            lasts.insert(i, last)
        if len(firsts) > LIMIT:
            del firsts[0], lasts[0]

    def covers(self, first: int, last: int) -> bool:
        """Whether every offset from ``first`` to ``last`` was served in a skippable batch."""
        i = bisect.bisect_right(self._firsts, first) - 1
        return i >= 0 and self._lasts[i] >= last

    def forget_below(self, offset: int) -> None:
        """Drop the ranges that end below ``offset`` (the continuity check is past them)."""
        if self._lasts and self._lasts[0] < offset:
            k = bisect.bisect_left(self._lasts, offset)
            del self._firsts[:k], self._lasts[:k]

    def __len__(self) -> int:
        return len(self._firsts)


_NEXT_BATCH = KeptRecords.next_batch  # aiokafka's (C when built): no super() per batch


class NotedRecords(KeptRecords):
    """A fetch's records (``KeptRecords``) noting the offsets of its control and
    transactional batches in ``skipped`` (set by ``FetchResult``; None: not noted)."""

    __slots__ = ("skipped",)

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.skipped: SkippedRanges | None = None

    def next_batch(self) -> Any:
        batch = _NEXT_BATCH(self)
        if (batch is not None and (batch.is_control_batch or batch.is_transactional)
                and self.skipped is not None):
            self.skipped.add(batch.base_offset, batch.next_offset - 1)
        return batch


def _result_init(self: Any, tp: KafkaPartition, *, assignment: Any, partition_records: Any,
                 backoff: float) -> None:
    """aiokafka's ``FetchResult.__init__``, then the fetch notes into its partition's ranges."""
    AIOKAFKA_RESULT_INIT(self, tp, assignment=assignment, partition_records=partition_records,
                         backoff=backoff)
    records = getattr(partition_records, "_records", None)
    if isinstance(records, NotedRecords):
        state = assignment.state_value(tp)
        ranges = getattr(state, _ATTR, None)
        if ranges is None:
            ranges = SkippedRanges()
            setattr(state, _ATTR, ranges)
        records.skipped = ranges


def skipped(consumer: AIOKafkaConsumer, tp: KafkaPartition) -> SkippedRanges | None:
    """What the fetches of ``tp`` by ``consumer`` skipped, as noted; None if nothing was
    (not installed, no such batch yet, or ``tp`` no longer assigned)."""
    try:
        state = consumer._subscription.subscription.assignment.state_value(tp)
    except (AttributeError, KeyError):
        return None
    found: SkippedRanges | None = getattr(state, _ATTR, None)
    return found


def _seams_hold() -> bool:
    """Whether aiokafka's fetcher reads batches and builds results as this hook expects."""
    try:
        unpack = inspect.getsource(fetcher.PartitionRecords._unpack_records)
        params = inspect.signature(AIOKAFKA_RESULT_INIT).parameters
    except (AttributeError, OSError, TypeError):
        return False
    return ("records.next_batch()" in unpack and "is_control_batch" in unpack
            and {"assignment", "partition_records", "backoff"} <= params.keys())


def install() -> None:
    """Have aiokafka's fetches note the batches its fetcher skips (idempotent; installs
    ``tolerant_records`` first, whose records object this one extends)."""
    tolerant_records.install()
    if fetcher.MemoryRecords is NotedRecords:
        return
    if fetcher.MemoryRecords is not KeptRecords or not _seams_hold():
        log.warning("aiokafka's fetcher is not as expected: each transaction marker will "
                    "cost gap-refetches re-fetches before it is accepted as a hole")
        return
    fetcher.MemoryRecords = NotedRecords
    fetcher.FetchResult.__init__ = _result_init
