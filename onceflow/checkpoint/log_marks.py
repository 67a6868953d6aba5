"""Which log the states were folded from: one record per input partition, checked on assignment.

A topic deleted and re-created under its name (or a broker whose storage was
wiped: ``docker compose down`` without a Kafka volume) restarts its offsets
at 0, below the watermarks its old records left in the states, and takes the
group's committed offsets with it: ``continuity``'s rewind guard, which
compares with the committed offset, cannot see it, and every new record
would be discarded as a copy, silently. Comparing the log's end is not
enough either: a new log that already grew past the old offsets looks like
the old one.

So each snapshot also writes, per input partition it advanced, a *mark*: the
offset, Kafka timestamp and a digest of key and value of the last record
whose effects it holds (``LOGS_STAGE`` row ``topic|partition``; its offset + 1
is the highest offset whose effects are written). On assignment the worker
fetches that one record per partition (a group-less consumer, one fetch
each, nothing per record): a log that ends at or below the mark's offset, or
holds another record there, is not the log the states were folded from, and
the worker stops (``LogReplaced``, exit 1) before anything of it is fetched
for the pipeline. A log whose record at the mark is gone while the log goes
on past it (compacted, or deleted by retention) cannot be told apart and is
accepted with a warning. The way out, once the operator decided the new
topic's events are new: another topic name, or ``onceflow forget --topic T``
(``onceflow.runtime.forget``), which drops the old log's watermarks and marks
and counts the log's generation up (a ``topic|partition|generation`` row that only
forget writes): republish steps write the new log's roots above the old log's
(``lineage.root_offset``), so pipelines downstream take them as new.

Mark rows live in the pipeline's first store (the one its stats go to),
written after the snapshot's states under the same fencing guard. A pipeline
without a store (a stateless republisher) keeps them in a compacted topic of
its own instead (``kafka.log_marks_topic``), written once the snapshot's outputs
are acknowledged and before its offsets commit: the same rows, the same check.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition
from aiokafka.errors import OffsetOutOfRangeError

from onceflow.kafka.continuity import PartitionRewound
from onceflow.kafka.kafka_parts import started
from onceflow.kafka.quiet_assign import assign_quietly
from onceflow.stages.declarations import LOGS_STAGE
from onceflow.stages.state import TopicPartition
from onceflow.stores.fencing import Guard

log = logging.getLogger(__name__)

#: A row that holds no mark (``onceflow forget`` leaves it): nothing to check.
NO_MARK = b"{}"
#: The check's fetch max wait (ms): what a broker may take to find a mark's offset.
PROBE_WAIT_MS = 2000
#: The check's fetch size, per partition and per answer (bytes): about the batch holding
#: the mark (a producer's batch is 16 KiB by default), not the records after it.
PROBE_BYTES = 64 * 1024
#: Per partition, the offset of the last mark a check could not tell about.
Told = dict[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class LogMark:
    """One record of an input partition: where it is and what it was."""

    offset: int
    timestamp: int
    digest: str

    def encode(self) -> bytes:
        return json.dumps({"o": self.offset, "t": self.timestamp, "d": self.digest},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, row: bytes) -> LogMark:
        doc = json.loads(row)
        return cls(int(doc["o"]), int(doc["t"]), str(doc["d"]))


class MarkRows(Protocol):
    """Where marks are kept: a ``StateStore``, or a store-less pipeline's topic
    (``kafka.log_marks_topic.KafkaLogMarks``). Blocking calls, from any thread but the
    worker's event loop."""

    def load(self, stage_id: str, keys: Sequence[str]) -> Mapping[str, bytes]: ...

    def save(self, stage_id: str, rows: Mapping[str, bytes], *,
             guard: Guard | None = None) -> None: ...


class HasRecord(Protocol):
    """A fetched record, as far as marks care (aiokafka's ConsumerRecord)."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


def mark_of(record: HasRecord) -> LogMark:
    """The mark of ``record``: its offset, timestamp and a digest of its key and value."""
    digest = hashlib.blake2b(digest_size=12)
    for part in (record.key, record.value):
        if part is None:
            digest.update(b"\x00")
        else:
            digest.update(b"\x01" + len(part).to_bytes(8, "big") + part)
    return LogMark(record.offset, int(record.timestamp), digest.hexdigest())


def row_key(tp: TopicPartition) -> str:
    return f"{tp[0]}|{tp[1]}"


#: The suffix of a partition's generation row (``generation_key``).
GENERATION = "|generation"


def generation_key(tp: TopicPartition) -> str:
    """The row of the partition's log generation: how many times ``onceflow forget`` let a
    new log of it be counted (``lineage.root_offset``). Only forget writes it; a missing
    row is generation 0."""
    return row_key(tp) + GENERATION


def mark_rows(marks: Mapping[TopicPartition, LogMark]) -> dict[str, bytes]:
    return {row_key(tp): mark.encode() for tp, mark in marks.items()}


class LogReplaced(PartitionRewound):
    """A partition's log is not the one the states were folded from (a permanent failure,
    as every ``PartitionRewound``: a restart cannot fix it)."""

    def __init__(self, tp: TopicPartition, mark: LogMark, why: str, downstream: str = ""):
        RuntimeError.__init__(
            self,
            f"{tp[0]}[{tp[1]}] is not the log this pipeline's states were folded from: "
            f"they hold its records up to offset {mark.offset}, and {why}. The topic was "
            f"deleted and re-created (or the broker lost its storage); its new records "
            f"would sit below the watermarks of the old ones and be discarded as copies, so "
            f"the worker stops. Either give the new topic a new name, or, if its events are "
            f"new and must be counted, stop every worker of the pipeline and run "
            f"`onceflow forget --topic {tp[0]} -c <app.conf>` "
            f"(docs/guide/operations-and-health.md: \"A topic re-created under its name\")"
            f"{downstream and f'. {downstream}'}")
        self.tp, self.committed, self.found = tp, mark.offset + 1, -1
        self.mark, self.why = mark, why


def forgotten_rows(rows: Mapping[str, bytes], topic: str) -> dict[str, bytes]:
    """What ``onceflow forget --topic`` writes over a pipeline's mark ``rows``: for each
    partition of ``topic`` holding a mark, ``NO_MARK`` (the worker takes the new log from
    its start) and the next generation (``generation_key``: its roots are republished
    above the old log's)."""
    out: dict[str, bytes] = {}
    for key, row in rows.items():
        name, _, partition = key.rpartition("|")
        if name == topic and row != NO_MARK:
            tp = (topic, int(partition))
            generation = int(rows.get(generation_key(tp), b"0"))
            out[key] = NO_MARK
            out[generation_key(tp)] = str(generation + 1).encode()
    return out


def downstream_note(republished_to: Sequence[str], topic: str) -> str:
    """What a forget of ``topic`` means for the pipeline's readers ("" if it republishes
    nothing): its new records are republished with roots in the next generation of the
    log (``lineage.root_offset``), above the old log's, so readers need no forget."""
    if not republished_to:
        return ""
    return (f"This pipeline republishes to {', '.join(republished_to)}: after the forget "
            f"the new records of {topic} go there with roots in the log's next generation, "
            f"above the old log's, so pipelines reading those count them without a forget "
            f"of their own")


@dataclass(frozen=True, slots=True)
class Verified:
    """What ``LogCheck.verify`` found: the marks it checked, and the generations of the logs
    forgotten before (``generation_key``)."""

    marks: dict[TopicPartition, LogMark]
    generations: dict[TopicPartition, int]


class LogCheck:
    """Does each partition still hold its mark's record? On assignment, and before sends and
    writes (``log_watch``).

    Args:
        store: where the marks are (the pipeline's first store, or its marks topic).
        options: a group-less consumer's options (``tail_reader.tail_options``).
        timeout: for the store read and the fetches together.
    """

    def __init__(self, store: MarkRows, options: Mapping[str, Any], timeout: float,
                 republished_to: Sequence[str] = ()):
        self._store = store
        # A fetch at a mark deep in a partition answers once the broker found the offset
        # (Tansu walks the partition's batches to it, answering empty past the wait): a long
        # wait costs nothing while the record is there.
        # One record is wanted, not a megabyte of those after it (each check's cost: 20 ms
        # against 3 for a mark deep in a Tansu partition). A batch larger than the limit
        # still comes whole in the first partition of an answer (KIP-74); the partitions
        # left out wait for the next fetch.
        self._options = {**options, "auto_offset_reset": "none",
                         "fetch_max_wait_ms": max(int(options.get("fetch_max_wait_ms", 500)),
                                                  PROBE_WAIT_MS),
                         "max_partition_fetch_bytes": PROBE_BYTES, "fetch_max_bytes": PROBE_BYTES}
        self._timeout = timeout
        self._republished_to = republished_to  # what else to forget: the refusal says
        self._consumer: AIOKafkaConsumer | None = None  # the probe, opened at first use
        self._probing = asyncio.Lock()
        self._closed = False
        self._told: Told = {}  # per partition, the last mark it could not tell about

    async def verify(self, assigned: set[KafkaPartition]) -> Verified:
        """Raise ``LogReplaced`` for the first assigned partition whose log changed; answer
        the marks checked and the generation of each partition whose log was forgotten."""
        keys = {row_key((tp.topic, tp.partition)): (tp.topic, tp.partition) for tp in assigned}
        numbered = {generation_key(tp): tp for tp in keys.values()}
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(
            None, lambda: self._store.load(LOGS_STAGE, sorted([*keys, *numbered])))
        marks = {keys[key]: LogMark.decode(row) for key, row in rows.items()
                 if key in keys and row != NO_MARK}
        generations = {numbered[key]: int(row) for key, row in rows.items() if key in numbered}
        if generations:
            log.info("root logs forgotten before, republished in their generation: %s",
                     sorted(generations.items()))
        if marks:
            await self.holds(marks)
            log.info("input logs checked: %d partitions hold the records their states were "
                     "folded from", len(marks))
        return Verified(marks, generations)

    async def holds(self, marks: Mapping[TopicPartition, LogMark]) -> None:
        """Raise ``LogReplaced`` for the first partition whose log does not hold its mark's
        record any more (on assignment, and before each send and write: ``LogWatch``)."""
        try:
            await asyncio.wait_for(self._probe(
                {KafkaPartition(*tp): mark for tp, mark in marks.items()}), self._timeout)
        except LogReplaced as refused:
            if not self._republished_to:
                raise
            raise LogReplaced(refused.tp, refused.mark, refused.why, downstream_note(
                self._republished_to, refused.tp[0])) from None

    async def close(self) -> None:
        """Stop the probe consumer (its consumer stream closing). A check still asked of this
        one after it (a send waiting meanwhile) opens a consumer for itself alone."""
        self._closed = True
        await self._drop()

    async def _drop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def _probe(self, marks: dict[KafkaPartition, LogMark]) -> None:
        """Fetch the record at each mark with the probe consumer, kept open between checks
        (they run as often as sends wait for them: ``log_watch``) and paused in between,
        so it fetches nothing then. One that failed is not reused."""
        async with self._probing:  # the assignment's check and a send's never interleave
            if self._consumer is None:
                self._consumer = await started(AIOKafkaConsumer(**self._options))
            done = False
            try:
                await self._fetch_marks(self._consumer, marks)
                done = True
            except LogReplaced:
                done = True
                raise
            finally:
                if not done or self._closed:
                    await self._drop()

    async def _fetch_marks(self, consumer: AIOKafkaConsumer,
                           marks: dict[KafkaPartition, LogMark]) -> None:
        # assigned anew each time: a partition's state (its high watermark) from an earlier
        # check must not answer for this one
        assign_quietly(consumer, marks)  # before every check: no INFO line each time
        for tp, mark in marks.items():
            consumer.seek(tp, mark.offset)
        pending = set(marks)
        try:
            while pending:
                try:
                    fetched = await consumer.getmany(*pending, timeout_ms=200, max_records=1)
                except OffsetOutOfRangeError as error:  # real Kafka: outside the log
                    refused = [tp for tp in (error.args[0] if error.args else ()) if tp in pending]
                    for tp in refused or sorted(pending):
                        await self._out_of_range(consumer, tp, marks[tp])
                        pending.discard(tp)
                    consumer.pause(*(set(marks) - pending))
                    continue
                for tp in list(pending):
                    records = fetched.get(tp)
                    if records:
                        judge((tp.topic, tp.partition), marks[tp], records[0],
                              self._told)
                        pending.discard(tp)
                    elif (high := consumer.highwater(tp)) is not None and high <= marks[tp].offset:
                        raise LogReplaced((tp.topic, tp.partition), marks[tp],
                                          f"it now ends at offset {high}")
                consumer.pause(*(set(marks) - pending))
        finally:
            consumer.pause(*marks)  # quiet until the next check

    async def _out_of_range(self, consumer: AIOKafkaConsumer, tp: KafkaPartition,
                            mark: LogMark) -> None:
        """ListOffsets only here, where a real broker refused the offset (Tansu never does)."""
        end = (await consumer.end_offsets([tp]))[tp]
        if end <= mark.offset:
            raise LogReplaced((tp.topic, tp.partition), mark, f"it now ends at offset {end}")
        start = (await consumer.beginning_offsets([tp]))[tp]
        log.log(level_once(self._told, (tp.topic, tp.partition), mark),
                "%s[%d]: the record at offset %d its states were folded up to is gone "
                "(the log now starts at %d: retention); cannot tell whether the topic "
                "was re-created", tp.topic, tp.partition, mark.offset, start)


def level_once(told: Told, tp: TopicPartition, mark: LogMark) -> int:
    """WARNING the first time a check cannot tell about this mark, DEBUG after: the checks
    repeat before every send until the next snapshot moves the mark. One entry per
    partition, so a long-lived worker on a compacted topic keeps no list of old marks."""
    if told.get(tp) == mark.offset:
        return logging.DEBUG
    told[tp] = mark.offset
    return logging.WARNING


def judge(tp: TopicPartition, mark: LogMark, found: HasRecord,
          told: Told | None = None) -> None:
    """Compare the first record fetched at the mark's offset with the mark (``told``: the
    marks already warned about)."""
    if found.offset != mark.offset:
        log.log(level_once({} if told is None else told, tp, mark),
                "%s[%d]: no record at offset %d (the log goes on at %d: compacted?); "
                "cannot tell whether the topic was re-created", tp[0], tp[1],
                mark.offset, found.offset)
        return
    now = mark_of(found)
    if now != mark:
        raise LogReplaced(tp, mark, f"its record at offset {mark.offset} differs (timestamp "
                          f"{now.timestamp}, was {mark.timestamp}; digest {now.digest}, was "
                          f"{mark.digest})")


__all__ = ["LOGS_STAGE", "NO_MARK", "LogCheck", "LogMark", "LogReplaced", "MarkRows",
           "Verified", "forgotten_rows", "generation_key", "judge", "mark_of", "mark_rows"]
