"""A record whose header name is not UTF-8 is read, instead of failing every fetch.

Kafka header names are strings, but a hand-made batch can hold any bytes there
(Kafka's Java clients cannot write one; a broker stores it). aiokafka decodes
them strictly, so one such record made every ``getmany`` of its partition
raise ``UnicodeDecodeError`` (wrapped in ``CorruptRecordException`` by the
pure-Python parser, used when the C extension is not built): the records
around it were never delivered, the stream failed until the restart budget
was spent, and the partition never moved again.

``install()`` changes two things in aiokafka's fetcher, and adds no work per
record: its ``MemoryRecords`` keeps the fetched bytes (one attribute per
fetch), and ``PartitionRecords.__next__`` is aiokafka's own five lines plus an
``except`` for that error (free in CPython until it fires). Only then is the
rest of that fetch parsed again, from the failing batch on, by aiokafka's
pure-Python batch with header names decoded with ``surrogateescape`` (the
bytes stay recoverable); iteration goes on where it failed, since aiokafka
skips the records below ``next_fetch_offset``, which it returned already.
Every other fetch keeps the C parser. The runner then dead-letters such a
record, naming the bytes (``stages.guards.check_header_names``).

Tested with aiokafka 0.14.0, with and without its C extension; the seams read
the same in the 0.12.0 and 0.13.0 sources (pyproject pins ``>=0.12,<0.15``).
``tests/unit/test_tolerant_records.py`` fails if a seam moves.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from typing import Any, SupportsIndex, overload

import aiokafka.consumer.fetcher as fetcher
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.record.legacy_records import LegacyRecordBatch
from aiokafka.record.memory_records import MemoryRecords

log = logging.getLogger(__name__)

_LOG_OVERHEAD = 12  # every batch format starts with offset (int64) and length (int32)
_MAGIC_AT = 16  # then v2's leader epoch (int32), v0/v1's crc (int32), then magic (int8)
_V2_HEADER = 61  # a v2 batch's header, before its records
#: aiokafka's own ``PartitionRecords.__next__``, which ``_next_record`` repeats.
AIOKAFKA_NEXT = fetcher.PartitionRecords.__next__
_told = False  # whether a re-parse was logged at INFO (the next ones are DEBUG)


class KeptRecords(MemoryRecords):  # type: ignore[misc]  # final for typing only
    """aiokafka's ``MemoryRecords`` (the C one when built) keeping its bytes for a re-parse."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.data = data


class _Name(bytearray):
    """A slice of a record whose ``decode`` keeps bytes that are not UTF-8 as surrogates."""

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytearray.decode(self, encoding, "surrogateescape")


class _Slicing(bytearray):
    """A batch's buffer whose slices are ``_Name``s.

    aiokafka's parser reads a header name as ``buffer[a:b].decode("utf-8")``;
    keys and values as ``bytes(buffer[a:b])``, which a ``_Name`` gives unchanged.
    """

    @overload
    def __getitem__(self, index: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> bytearray: ...
    def __getitem__(self, index: SupportsIndex | slice) -> int | bytearray:
        if isinstance(index, slice):
            return _Name(super().__getitem__(index))
        return super().__getitem__(index)


class LenientBatch(_DefaultRecordBatchPy):  # type: ignore[misc]  # final for typing only
    """aiokafka's pure-Python v2 batch, header names decoded with ``surrogateescape``."""

    def __iter__(self) -> LenientBatch:
        super().__iter__()  # decompresses: the records' bytes are in ``_buffer`` from here
        self._buffer: bytearray = _Slicing(self._buffer)
        return self


class Reparsed:
    """The batches of one fetch from ``resume_at`` on, v2 ones as ``LenientBatch``.

    Batches that end at or below ``resume_at`` were fully returned already and
    are left out: aiokafka sets ``next_fetch_offset`` to each batch's end.
    """

    def __init__(self, data: bytes, resume_at: int) -> None:
        self._size = len(data)
        self._batches = deque(b for b in _batches(data) if b.next_offset > resume_at)

    def size_in_bytes(self) -> int:
        return self._size

    def has_next(self) -> bool:
        return bool(self._batches)

    def next_batch(self) -> Any:
        return self._batches.popleft() if self._batches else None


def _batches(data: bytes) -> Iterator[Any]:
    """The whole batches in ``data`` (a fetch may end with part of one, left out)."""
    view = memoryview(data)
    pos = 0
    while len(view) - pos >= _LOG_OVERHEAD:
        end = pos + _LOG_OVERHEAD + int.from_bytes(view[pos + 8:pos + 12], "big", signed=True)
        if end > len(view):
            return
        part = view[pos:end]
        if len(part) <= _MAGIC_AT:
            raise CorruptRecordException(f"record batch of {len(part)} bytes")
        magic = part[_MAGIC_AT]
        if magic < 2:
            yield LegacyRecordBatch(part, magic)  # v0/v1 have no headers
        elif len(part) < _V2_HEADER:
            raise CorruptRecordException(f"record batch of {len(part)} bytes")
        else:
            yield LenientBatch(part)
        pos = end


def _next_record(self: Any) -> Any:
    """aiokafka's ``PartitionRecords.__next__``, re-parsing a fetch a header name broke."""
    try:
        return next(self._records_iterator)
    except StopIteration:
        self._records_iterator = None  # as aiokafka: breaks a reference cycle
        raise
    except (UnicodeDecodeError, CorruptRecordException) as error:
        kept = self._records
        if not isinstance(kept, KeptRecords) or not _undecodable(error):
            raise  # corrupt, or re-parsed already (so not a header name): aiokafka's way
    global _told
    log.log(logging.DEBUG if _told else logging.INFO, "%s[%d]: a record batch at offset %d or "
            "after holds a header name that is not UTF-8: parsing it again leniently%s",
            self._tp.topic, self._tp.partition, self.next_fetch_offset,
            "" if _told else " (said once; its records are dead-lettered)")
    _told = True
    self._records = Reparsed(kept.data, self.next_fetch_offset)
    self._records_iterator = self._unpack_records()
    return _next_record(self)


def _undecodable(error: Exception) -> bool:
    """A name the C parser could not decode, or the pure-Python one (it wraps the error)."""
    return isinstance(error, UnicodeDecodeError) or isinstance(error.__cause__,
                                                               UnicodeDecodeError)


def install() -> None:
    """Make aiokafka's fetcher tolerate header names that are not UTF-8 (idempotent)."""
    records = fetcher.PartitionRecords
    if records.__next__ is _next_record:
        return
    if fetcher.MemoryRecords is not MemoryRecords or not hasattr(records, "_unpack_records"):
        log.warning("aiokafka's fetcher is not as expected: a record whose header name is not "
                    "UTF-8 will fail its partition's fetches")
        return
    fetcher.MemoryRecords = KeptRecords
    records.__next__ = _next_record
