"""``--from-offsets committed-at:TS``: reconcile the input written up to a time.

The group's offsets are kept by Kafka as they are now, not as they were at a past
time; what the group can have committed at time TS is at most the records appended
by then. So the replay stops, on each input partition, at the first record whose
Kafka timestamp is past TS (never past the group's committed offset). Any stopping
point is sound: every record before it is replayed from the log's head, and a state
that folded a record past it is ``ahead`` (not decidable), as for the commits, so
the keys untouched since TS are proven and the others named, never guessed.

The stopping offsets are found by reading: a binary search over the partition with
one-record fetches (about log2(records) fetches a partition). Not ListOffsets by
timestamp: the local Tansu broker answers a time past its last record with offset 0
(and timestamp -1) where Kafka answers none, which would cut the replay at the start
(seen on the test broker; its answers for times between records were right), and
its end offsets are wrong for batches of several records. With CreateTime
timestamps from producers' clocks out of order, the search finds a point where the
timestamps cross TS, not necessarily the first: still a sound stopping point, only
not exactly TS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from onceflow.kafka.tail_reader import tail_options

__all__ = ["parse_from_offsets", "stopping_offsets"]


def parse_from_offsets(text: str) -> int | None:
    """``earliest`` (None: up to the commits) or ``committed-at:TS``, TS an ISO 8601 time
    (UTC if no zone) or milliseconds since the epoch; answers TS in ms."""
    if text == "earliest":
        return None
    prefix = "committed-at:"
    if not text.startswith(prefix):
        raise ValueError(f"--from-offsets {text!r}: expected earliest or committed-at:TS")
    when = text[len(prefix):]
    if when.isdigit():
        return int(when)
    try:
        moment = datetime.fromisoformat(when)
    except ValueError:
        raise ValueError(f"--from-offsets {text!r}: {when!r} is no ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


async def stopping_offsets(consumer_options: Mapping[str, Any],
                           committed: Mapping[tuple[str, int], int], at_ms: int,
                           timeout: float) -> dict[tuple[str, int], int]:
    """Per partition: the first offset below the committed one whose record's timestamp is
    past ``at_ms`` (the committed offset if none is). A consumer per partition: aiokafka's
    hung in ``stop`` after a re-assignment (``kafka.tail_reader.fetched_high_watermarks``)."""
    found = {}
    for (topic, partition), end in sorted(committed.items()):
        if end <= 0:
            found[(topic, partition)] = 0
            continue
        consumer = AIOKafkaConsumer(**tail_options(consumer_options))
        await consumer.start()
        try:
            found[(topic, partition)] = await _search(consumer, TopicPartition(topic, partition),
                                                      end, at_ms, timeout)
        finally:
            await consumer.stop()
    return found


async def _search(consumer: AIOKafkaConsumer, tp: TopicPartition, end: int, at_ms: int,
                  timeout: float) -> int:
    consumer.assign([tp])
    low, high = 0, end  # the stopping offset is in [low, high]
    while low < high:
        middle = (low + high) // 2
        record = await _first_at(consumer, tp, middle, high, timeout)
        if record is None or record.timestamp > at_ms:
            high = middle  # nothing at or past middle before high is at or before TS
        else:
            low = record.offset + 1
    return low


async def _first_at(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int, end: int,
                    timeout: float) -> ConsumerRecord[bytes, bytes] | None:
    """The first record at or past ``offset`` and before ``end`` (None: none there)."""
    consumer.seek(tp, offset)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        fetched = await consumer.getmany(tp, timeout_ms=300, max_records=1)
        for record in fetched.get(tp, ()):
            return record if record.offset < end else None
        if await consumer.position(tp) >= end:
            return None
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{tp.topic}/{tp.partition}: no record at or past {offset} "
                               f"in {timeout:.0f} s")
