"""Producer-sequence dedup: drop the records an at-least-once producer sent twice.

A producer that re-sends after a lost ack writes the same event again at a
new offset, which offset watermarks cannot recognise. With ``dedup=`` a
source record names its producer and a strictly increasing sequence number
(from a header or the parsed value, never the Kafka key), optionally an
epoch that a producer bumps when it restarts its numbering. Per (root
partition, producer) the table keeps the highest (epoch, sequence) seen; a
record not above it is a producer duplicate, dropped before any step.

Crash safety (docs/architecture.md, "Producer sequences"): the table follows
the stream, not the folds, and each partition's row also holds the next
offset it covers. Rows are written last in a snapshot, after every state, so
a durable row never claims more than the states hold: records below its
offset are replays of records whose effects are durable (skipped whole),
and the records from it on are classified again exactly as the first time.

Idle producers are forgotten by positions: a producer whose last record is
more than ``idle_records`` offsets below the record being classified is unknown
again. Not by time: the records' Kafka timestamps (CreateTime) are set by the
producers' clocks, so a producer whose clock is behind would look idle at each
record and never have a re-send recognised, and one record stamped far ahead
would make every producer of its partition look idle. Nor by the worker's wall
clock: a replay after a crash must classify the records from a row's offset on
exactly as the first run did (a re-send dropped once and admitted on replay is
counted twice), and a replay meets another time but the same offsets. Rows
written by the timestamp rule load with each producer counted as seen at the
row's offset (kept at least ``idle_records`` more, never forgotten sooner).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from onceflow.stages.declarations import SEQUENCE_STAGE as SEQUENCE_STAGE  # a reserved id
from onceflow.stages.declarations import Extract
from onceflow.stages.declarations import ProducerDedup as ProducerDedup  # declared by users
from onceflow.stages.formats import FormatError
from onceflow.stages.outcome import BatchOutcome, ConsumedRecord
from onceflow.stages.state import TopicPartition

MAX_PRODUCER = 1000  # characters of a producer id
MIN_I64: Final = -(2**63)  # sequences and epochs are 64-bit
MAX_I64: Final = 2**63 - 1
NO_STORE = ("dedup= needs a store for the producer sequences and the pipeline has no "
            "aggregate: name one with ProducerDedup(..., store='redis')")
#: Reads stored rows by key ``topic|partition``; absent keys are absent.
SequenceLoader = Callable[[Sequence[str]], Mapping[str, bytes]]


@dataclass(slots=True)
class PartitionSequences:
    """One source partition's table: what a stored row holds.

    ``producers``: producer -> [epoch, highest sequence, offset of its last record].
    ``next_offset``: every record below it is already classified.
    ``duplicates``: producer duplicates dropped so far (durable, so exact).
    ``unkeyed``: records without a Kafka key met since loaded (memory only, for a warning:
    a re-send without a key may land on another partition, where this table cannot see it).
    """

    next_offset: int = 0
    duplicates: int = 0
    producers: dict[str, list[int]] = field(default_factory=dict)
    unkeyed: int = 0

    def admit(self, producer: str, epoch: int, sequence: int, offset: int,
              idle_records: int) -> bool:
        """Register one record at ``offset``; False if it is a producer duplicate (then
        counted). A producer last seen more than ``idle_records`` offsets below is new."""
        entry = self.producers.get(producer)
        if entry is None or entry[2] < offset - idle_records:  # new, or forgotten
            self.producers[producer] = [epoch, sequence, offset]
            return True
        if offset > entry[2]:
            entry[2] = offset
        if epoch > entry[0] or (epoch == entry[0] and sequence > entry[1]):
            entry[0], entry[1] = epoch, sequence
            return True
        self.duplicates += 1
        return False

    def expire(self, idle_records: int) -> None:
        """Drop producers ``admit`` already treats as unknown from the next offset on
        (memory only, no change of rule)."""
        horizon = self.next_offset - idle_records
        for producer in [p for p, entry in self.producers.items() if entry[2] < horizon]:
            del self.producers[producer]

    def encode(self) -> bytes:
        return json.dumps({"next": self.next_offset, "dups": self.duplicates,
                           "producers": self.producers, "seen": "offset"},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> PartitionSequences:
        """A stored row; one written by the timestamp rule (no ``"seen"``) has each
        producer's timestamp replaced by the row's last offset (see the module)."""
        doc = json.loads(data)
        if doc.get("seen") == "offset":
            return cls(doc["next"], doc["dups"],
                       {p: list(entry) for p, entry in doc["producers"].items()})
        last = doc["next"] - 1
        return cls(doc["next"], doc["dups"],
                   {p: [entry[0], entry[1], last] for p, entry in doc["producers"].items()})


def dropped_duplicates(rows: Iterable[bytes]) -> int:
    """Producer duplicates dropped so far, summed over stored tables.

    Exact, unlike the stats counter: a table's count is written with the
    states its partition's records changed.
    """
    return sum(PartitionSequences.decode(row).duplicates for row in rows)


class DedupError(FormatError):
    """A source record lacks a usable producer id, sequence or epoch: a dead letter."""

    def __init__(self, message: str):
        super().__init__("dedup", message)


class SequenceTables:
    """The cached tables of the source partitions this runner has seen, and which changed."""

    def __init__(self, spec: ProducerDedup, sources: Iterable[str], load: SequenceLoader | None,
                 store: str | None):
        if load is None or store is None:
            raise ValueError(NO_STORE)
        self.spec = spec
        self._sources = frozenset(sources)
        self._load = load
        self.partitions: dict[TopicPartition, PartitionSequences] = {}
        self.dirty: set[TopicPartition] = set()
        self._replayed = 0
        self._duplicates = 0
        self._idle_records = spec.idle_records  # read once: spec is a plain (uncompiled) class
        #: Producer and sequence functions, both functions and no epoch (``_direct``; else
        #: ``str`` stands in, never called): a str producer and an int sequence are taken
        #: as they are (what the full path would make of them); anything else takes the
        #: full path and its errors.
        producer, sequence = spec.producer, spec.sequence
        self._direct = callable(producer) and callable(sequence) and spec.epoch is None
        self._producer: Callable[[Any], Any] = producer if callable(producer) else str
        self._sequence: Callable[[Any], Any] = sequence if callable(sequence) else str

    def table_of(self, consumed: TopicPartition, records: Iterable[ConsumedRecord]
                 ) -> PartitionSequences | None:
        """The table of a source partition whose run of records starts (None for another
        topic); the first missing one loads every table ``records`` (the batch) lacks."""
        table = self.partitions.get(consumed)
        if table is None and consumed[0] in self._sources:
            self.prepare(records)
            table = self.partitions[consumed]
        return table

    def prepare(self, records: Iterable[ConsumedRecord]) -> None:
        """Load the tables of source partitions not cached yet, in one batched read."""
        missing = set()
        last_topic, last_partition = None, -1  # records come in runs of one partition
        for record in records:
            topic, partition = record.topic, record.partition  # each read once
            if partition == last_partition and topic == last_topic:
                continue
            last_topic, last_partition = topic, partition
            tp = (topic, partition)
            if topic in self._sources and tp not in self.partitions:
                missing.add(tp)
        if not missing:
            return
        keys = {f"{topic}|{partition}": (topic, partition) for topic, partition in missing}
        rows = self._load(sorted(keys))
        for key, tp in keys.items():
            row = rows.get(key)
            self.partitions[tp] = PartitionSequences() if row is None else \
                PartitionSequences.decode(row)

    def covered(self, consumed: TopicPartition, table: PartitionSequences, start: int,
                replays: int) -> None:
        """A run of ``consumed``'s records ended: its table's next offset moved from
        ``start`` (the run's records at or above it were classified), ``replays`` records
        below it were skipped whole (classified before, their effects durable or in
        memory)."""
        if table.next_offset != start:
            self.dirty.add(consumed)
        self._replayed += replays

    def admit(self, table: PartitionSequences, record: ConsumedRecord, value: Any) -> bool:
        """False for a producer duplicate; ``value`` is the record parsed in its format,
        ``table`` its partition's (``table_of``)."""
        producer: Any = None
        sequence: Any = None
        if self._direct:  # the usual case: a str and a 64-bit int, taken as they are
            try:
                producer, sequence = self._producer(value), self._sequence(value)
            except Exception:
                producer = None  # the full path reads them again, with its errors
        if type(producer) is str and len(producer) <= MAX_PRODUCER and \
                type(sequence) is int and MIN_I64 <= sequence <= MAX_I64:
            epoch = 0
        else:
            spec = self.spec
            producer = str(_extract(record, value, spec.producer, "producer"))
            if len(producer) > MAX_PRODUCER:  # it would sit in every write of the table's row
                raise DedupError(f"dedup: the producer id is {len(producer)} characters long "
                                 f"(at most {MAX_PRODUCER})")
            sequence = _integer(record, value, spec.sequence, "sequence")
            epoch = 0 if spec.epoch is None else _integer(record, value, spec.epoch, "epoch")
        if record.key is None:
            table.unkeyed += 1
        if table.admit(producer, epoch, sequence, record.offset, self._idle_records):
            return True
        self._duplicates += 1
        return False

    def unkeyed(self) -> list[TopicPartition]:
        """Source partitions where records without a Kafka key were met (see
        ``PartitionSequences.unkeyed``)."""
        return [tp for tp, table in self.partitions.items() if table.unkeyed]

    def count(self, outcome: BatchOutcome) -> None:
        """Move this batch's counts into the outcome (stage ``source``)."""
        if self._replayed:
            outcome.duplicates["source"] += self._replayed
        if self._duplicates:
            outcome.producer_duplicates["source"] += self._duplicates
        self._replayed = self._duplicates = 0

    def take_dirty(self) -> dict[str, bytes]:
        """Rows of the tables changed since the last call (idle producers dropped first)."""
        rows = {}
        for topic, partition in sorted(self.dirty):
            table = self.partitions[(topic, partition)]
            table.expire(self._idle_records)
            rows[f"{topic}|{partition}"] = table.encode()
        self.dirty = set()
        return rows

    def forget(self) -> None:
        """Drop every cached table (they reload); refused while some are unwritten."""
        if self.dirty:
            raise RuntimeError("forget() with unpersisted producer sequences")
        self.partitions.clear()


def _extract(record: ConsumedRecord, value: Any, extract: Extract, what: str) -> Any:
    if not isinstance(extract, str):
        try:
            found = extract(value)
        except Exception as error:
            raise DedupError(f"dedup: the {what} extractor raised {type(error).__name__}: "
                             f"{error}") from error
        if found is None:
            raise DedupError(f"dedup: the {what} extractor found nothing")
        return found
    header = None
    for name, data in record.headers or ():
        if name == extract:
            header = data
    if header is None:
        raise DedupError(f"dedup: the record has no {what} header {extract!r}")
    return header.decode(errors="replace")


def _integer(record: ConsumedRecord, value: Any, extract: Extract, what: str) -> int:
    found = _extract(record, value, extract, what)
    if type(found) is int and MIN_I64 <= found <= MAX_I64:  # the usual case, checked first
        return found
    try:
        if isinstance(found, (bool, float)):
            raise ValueError(found)
        number = int(found)
    except (ValueError, TypeError) as error:
        raise DedupError(f"dedup: the {what} must be an integer, got {_short(found)}") from error
    if not MIN_I64 <= number <= MAX_I64:  # a forged huge one would outrank every later record
        raise DedupError(f"dedup: the {what} must fit in 64 bits, got {_short(found)}")
    return number


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:100]}... ({len(text)} characters)"
