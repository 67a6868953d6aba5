"""aiokafka's fetcher reads a batch whose header name is not UTF-8, and every record around it.

Raw batch bytes as a broker returns them (several batches in one fetch, a
compressed one), parsed by aiokafka's own ``PartitionRecords``
with ``tolerant_records`` installed, as the worker does.
"""

from __future__ import annotations

import inspect
import struct
from typing import Any

import pytest
from aiokafka.consumer import fetcher
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch, _DefaultRecordBatchPy
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy as PyBuilder
from aiokafka.structs import TopicPartition

from onceflow.kafka import tolerant_records
from onceflow.kafka.tolerant_records import KeptRecords

RAW = b"\xff\xfebad"
TP = TopicPartition("in", 0)


class RawName(str):
    """A header name whose bytes are not UTF-8, as a hand-made batch holds it."""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return RAW


Rec = tuple[bytes, list[tuple[str, bytes]]]


def batch(base: int, records: list[Rec], gzip: bool = False) -> bytes:
    """One v2 batch at ``base`` (what a broker stores), built by aiokafka's Python builder."""
    codec = _DefaultRecordBatchPy.CODEC_GZIP if gzip else 0
    builder = PyBuilder(2, codec, 0, -1, -1, -1, 1 << 20)
    for delta, (value, headers) in enumerate(records):
        builder.append(delta, 1_000 + delta, None, value, headers)
    data = builder.build()
    struct.pack_into(">q", data, 0, base)  # the broker's offset; the CRC does not cover it
    return bytes(data)


def fetch(data: bytes, fetch_offset: int = 0) -> list[Any]:
    """The records aiokafka's fetcher returns for ``data`` (CRCs checked, as by default)."""
    records = fetcher.PartitionRecords(TP, KeptRecords(data), None, fetch_offset, None, None,
                                       True, fetcher.READ_UNCOMMITTED)
    return list(records)


def good(n: int) -> list[Rec]:
    return [(f"v{i}".encode(), [("h", b"x")]) for i in range(n)]


HOSTILE: Rec = (b"hostile", [("a", b"1"), (RawName("x"), b"2"), ("z", b"3")])


@pytest.fixture(autouse=True)
def installed() -> None:
    tolerant_records.install()


def test_a_strict_parse_fails_on_the_batch() -> None:
    """The bug: aiokafka's parser raises on the name, losing the batch."""
    with pytest.raises((UnicodeDecodeError, CorruptRecordException)):  # C, pure Python
        list(DefaultRecordBatch(batch(0, [*good(2), HOSTILE])))


def test_every_record_around_the_name_is_returned_in_order() -> None:
    data = (batch(0, good(3)) + batch(3, [*good(2), HOSTILE, *good(2)])
            + batch(8, good(2), gzip=True))
    got = fetch(data)
    assert [r.offset for r in got] == list(range(10))
    assert [r.value for r in got] == [b"v0", b"v1", b"v2", b"v0", b"v1", b"hostile", b"v0",
                                      b"v1", b"v0", b"v1"]
    names = [name for name, _ in got[5].headers]
    assert names[0] == "a" and names[2] == "z"
    assert names[1].encode(errors="surrogateescape") == RAW  # the bytes, recoverable
    with pytest.raises(UnicodeEncodeError):
        names[1].encode()  # what the runner's guard sees
    assert all(r.headers == (("h", b"x"),) for i, r in enumerate(got) if i != 5)


def test_a_compressed_batch_and_a_fetch_from_its_middle() -> None:
    data = batch(1, [*good(3), HOSTILE, *good(1)], gzip=True) + batch(6, good(1))
    got = fetch(data, fetch_offset=3)  # a broker returns the batch holding it, whole
    assert [(r.offset, r.value) for r in got] == [(3, b"v2"), (4, b"hostile"), (5, b"v0"),
                                                  (6, b"v0")]


def test_a_partial_batch_at_the_end_of_a_fetch_is_left_for_the_next_one() -> None:
    data = batch(0, [HOSTILE]) + batch(1, good(2))[:-5]
    records = fetcher.PartitionRecords(TP, KeptRecords(data), None, 0, None, None, True,
                                       fetcher.READ_UNCOMMITTED)
    assert [r.offset for r in records] == [0]
    assert records.next_fetch_offset == 1


def test_a_corrupt_batch_after_it_still_fails_as_corrupt() -> None:
    data = bytearray(batch(0, [HOSTILE]) + batch(1, good(2)))
    data[-1] ^= 0xFF  # the CRC of the second batch no longer matches
    with pytest.raises(CorruptRecordException):
        fetch(bytes(data))


def test_normal_batches_keep_the_c_parser() -> None:
    kept = KeptRecords(batch(0, good(2)))
    assert type(kept.next_batch()) is DefaultRecordBatch  # the C one when aiokafka is built
    assert issubclass(fetcher.MemoryRecords, KeptRecords)  # skipped_batches extends it


def test_the_seams_are_as_aiokafka_0_14_has_them() -> None:
    """``_next_record`` repeats aiokafka's ``__next__``: an upgrade that changes it fails here."""
    source = inspect.getsource(tolerant_records.AIOKAFKA_NEXT)
    assert "return next(self._records_iterator)" in source
    assert "self._records_iterator = None" in source
    assert fetcher.PartitionRecords.__next__ is tolerant_records._next_record
    assert "records.next_batch()" in inspect.getsource(fetcher.PartitionRecords._unpack_records)
