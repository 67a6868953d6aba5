"""A transaction's marker and an aborted transaction are holes the fetch explains: passed
without a re-fetch; a hole no served batch covers is still re-fetched.

Raw batches as a broker returns them, built by aiokafka's own Python builder (a control
batch too: its attributes carry the control bit, as a broker writes a marker), parsed
by aiokafka's own ``PartitionRecords`` and handed out by its ``FetchResult`` against a
real consumer's assignment, with ``skipped_batches`` installed as the worker does; the
records then go to the continuity check the consumer stream runs.
"""

from __future__ import annotations

import asyncio
import inspect
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer import fetcher
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy as PyBuilder
from aiokafka.structs import TopicPartition

from onceflow.kafka import skipped_batches
from onceflow.kafka.continuity import Continuity, Verdict
from onceflow.kafka.fetch_continuity import explained_by
from onceflow.kafka.kafka_parts import ours
from onceflow.kafka.skipped_batches import LIMIT, NotedRecords, SkippedRanges

TP = TopicPartition("in", 0)
PID = 7  # the transactional producer's id
COMMIT, ABORT = 1, 0  # a control record's type (key: version int16, type int16)


class _ControlBuilder(PyBuilder):  # type: ignore[misc]
    """aiokafka's builder writing a control batch (the bit only a broker sets)."""

    def _get_attributes(self, include_compression_type: bool = True) -> int:
        return int(super()._get_attributes(include_compression_type)) | self.CONTROL_MASK


def batch(base: int, count: int, pid: int = -1) -> bytes:
    """``count`` records at ``base``; transactional when ``pid`` is a producer's."""
    builder = PyBuilder(2, 0, pid >= 0, pid, 0 if pid >= 0 else -1, -1, 1 << 20)
    for delta in range(count):
        builder.append(delta, 1_000 + delta, None, f"v{base + delta}".encode(), [])
    return _at(base, builder.build())


def marker(base: int, kind: int, pid: int = PID) -> bytes:
    """A transaction's commit or abort marker at ``base``: one control record."""
    builder = _ControlBuilder(2, 0, True, pid, 0, -1, 1 << 20)
    builder.append(0, 2_000, struct.pack(">hh", 0, kind), struct.pack(">hi", 0, 0), [])
    return _at(base, builder.build())


def _at(base: int, data: bytearray) -> bytes:
    struct.pack_into(">q", data, 0, base)  # the broker's offset; the CRC does not cover it
    return bytes(data)


@pytest.fixture(autouse=True)
def installed() -> None:
    skipped_batches.install()


@pytest.fixture
def consumer() -> Iterator[AIOKafkaConsumer]:
    """A consumer (never started) assigned ``TP``: the assignment a fetch result lives in."""
    loop = asyncio.new_event_loop()

    async def make() -> AIOKafkaConsumer:
        made = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        made.assign([TP])
        return made

    made = loop.run_until_complete(make())
    yield made
    loop.run_until_complete(made._client.close())
    loop.close()


def fetch(consumer: AIOKafkaConsumer, data: bytes, fetch_offset: int,
          isolation: int = fetcher.READ_COMMITTED,
          aborted: list[tuple[int, int]] | None = None) -> list[Any]:
    """What ``getmany`` returns for a fetch response holding ``data`` (as
    ``Fetcher._proc_fetch_request`` and ``fetched_records`` build and drain it)."""
    consumer._subscription.seek(TP, fetch_offset)
    records = fetcher.PartitionRecords(TP, fetcher.MemoryRecords(data), aborted, fetch_offset,
                                       None, None, True, isolation)
    result = fetcher.FetchResult(TP, partition_records=records,
                                 assignment=consumer._subscription.subscription.assignment,
                                 backoff=0)
    got: list[Any] = result.getall()
    return got


def checked(consumer: AIOKafkaConsumer, continuity: Continuity, recs: list[Any]) -> Verdict:
    return continuity.check(ours(TP), recs, explained_by(consumer, TP))


def test_a_commit_marker_inside_a_fetch_is_no_hole(consumer: AIOKafkaConsumer) -> None:
    data = batch(0, 3, PID) + marker(3, COMMIT) + batch(4, 2)
    recs = fetch(consumer, data, 0)
    assert [r.offset for r in recs] == [0, 1, 2, 4, 5]  # aiokafka skipped offset 3
    continuity = Continuity(refetches=5)
    continuity.expect(ours(TP), 0)
    assert checked(consumer, continuity, recs) == Verdict(5)
    assert continuity.expected(ours(TP)) == 6


def test_without_the_explanation_the_marker_costs_a_refetch(consumer: AIOKafkaConsumer) -> None:
    """The old behaviour (no ``explained``): the marker looked like a lost batch."""
    recs = fetch(consumer, batch(0, 3, PID) + marker(3, COMMIT) + batch(4, 2), 0)
    continuity = Continuity(refetches=5)
    continuity.expect(ours(TP), 0)
    assert continuity.check(ours(TP), recs) == Verdict(3, refetch_from=3)


def test_a_marker_at_the_end_of_one_fetch_explains_the_next(consumer: AIOKafkaConsumer) -> None:
    continuity = Continuity(refetches=5)
    continuity.expect(ours(TP), 10)
    first = fetch(consumer, batch(10, 2, PID) + marker(12, COMMIT), 10)
    assert [r.offset for r in first] == [10, 11]
    assert checked(consumer, continuity, first) == Verdict(2)
    second = fetch(consumer, batch(13, 2), 13)  # the position moved past the marker
    assert checked(consumer, continuity, second) == Verdict(2)
    assert continuity.expected(ours(TP)) == 15


def test_a_fetch_of_only_a_marker_still_explains_the_next(consumer: AIOKafkaConsumer) -> None:
    """``getmany`` leaves out a partition whose fetch returned nothing: the note stays."""
    continuity = Continuity(refetches=5)
    continuity.expect(ours(TP), 0)
    assert checked(consumer, continuity, fetch(consumer, batch(0, 2, PID), 0)) == Verdict(2)
    assert fetch(consumer, marker(2, COMMIT), 2) == []
    assert checked(consumer, continuity, fetch(consumer, batch(3, 1), 3)) == Verdict(1)


def test_an_aborted_transaction_read_committed(consumer: AIOKafkaConsumer) -> None:
    data = batch(0, 2) + batch(2, 3, PID) + marker(5, ABORT) + batch(6, 2)
    recs = fetch(consumer, data, 0, aborted=[(PID, 2)])
    assert [r.offset for r in recs] == [0, 1, 6, 7]  # 2..4 aborted, 5 the marker
    continuity = Continuity(refetches=5)
    continuity.expect(ours(TP), 0)
    assert checked(consumer, continuity, recs) == Verdict(4)


def test_read_uncommitted_delivers_aborted_records_and_skips_markers(
        consumer: AIOKafkaConsumer) -> None:
    data = batch(0, 3, PID) + marker(3, ABORT) + batch(4, 1)
    recs = fetch(consumer, data, 0, isolation=fetcher.READ_UNCOMMITTED, aborted=[(PID, 0)])
    assert [r.offset for r in recs] == [0, 1, 2, 4]
    continuity = Continuity(refetches=5)
    continuity.expect(ours(TP), 0)
    assert checked(consumer, continuity, recs) == Verdict(4)


def test_a_hole_no_batch_covers_is_still_refetched(consumer: AIOKafkaConsumer) -> None:
    """Offsets 5..6 were never served (Tansu's batch written late): a re-fetch, even
    right after an explained marker."""
    continuity = Continuity(refetches=2)
    continuity.expect(ours(TP), 0)
    recs = fetch(consumer, batch(0, 3, PID) + marker(3, COMMIT) + batch(4, 1) + batch(7, 2), 0)
    assert [r.offset for r in recs] == [0, 1, 2, 4, 7, 8]
    assert checked(consumer, continuity, recs) == Verdict(4, refetch_from=5)


def test_a_marker_does_not_explain_missing_offsets_beside_it(
        consumer: AIOKafkaConsumer) -> None:
    continuity = Continuity(refetches=2)
    continuity.expect(ours(TP), 0)
    recs = fetch(consumer, batch(0, 2) + marker(2, COMMIT) + batch(5, 1), 0)  # 3, 4 unserved
    assert checked(consumer, continuity, recs) == Verdict(2, refetch_from=2)


def test_plain_batches_note_nothing(consumer: AIOKafkaConsumer) -> None:
    fetch(consumer, batch(0, 3) + batch(3, 2), 0)
    state = consumer._subscription.subscription.assignment.state_value(TP)
    assert not getattr(state, "onceflow_skipped", ())


def test_ranges_merge_cover_and_are_forgotten() -> None:
    ranges = SkippedRanges()
    for first, last in [(10, 12), (13, 13), (20, 20), (5, 6), (7, 9)]:
        ranges.add(first, last)
    assert len(ranges) == 2  # 5..13 and 20
    assert ranges.covers(5, 13) and ranges.covers(8, 8) and ranges.covers(20, 20)
    assert not ranges.covers(4, 5) and not ranges.covers(13, 14) and not ranges.covers(14, 19)
    ranges.add(6, 25)
    assert len(ranges) == 1 and ranges.covers(5, 25)
    ranges.forget_below(26)
    assert len(ranges) == 0 and not ranges.covers(25, 25)


def test_ranges_are_bounded() -> None:
    ranges = SkippedRanges()
    for n in range(LIMIT + 10):
        ranges.add(2 * n, 2 * n)  # a marker every other offset: nothing merges
    assert len(ranges) == LIMIT
    assert not ranges.covers(0, 0) and ranges.covers(2 * (LIMIT + 9), 2 * (LIMIT + 9))


def test_the_seams_are_as_aiokafka_0_14_has_them() -> None:
    """An aiokafka upgrade that moves a seam fails here (install would only warn)."""
    assert fetcher.MemoryRecords is NotedRecords
    assert fetcher.FetchResult.__init__ is skipped_batches._result_init
    unpack = inspect.getsource(fetcher.PartitionRecords._unpack_records)
    assert "records.next_batch()" in unpack and "is_control_batch" in unpack
    assert skipped_batches._seams_hold()
