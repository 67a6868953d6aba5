"""Reads partitions of a topic of the pipeline's own from their start to their end.

For the topics a worker keeps its own records in and reads at assignment (the merge
log from where committed offsets allow: ``merge_log_topic``; a store-less pipeline's
log marks whole: ``log_marks_topic``), and for reconcile. The end is the high watermark a fetch
reports, never ListOffsets (the local broker's end offsets are not to be trusted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

#: A partition as read: its records (tombstones included) and the high watermark read to.
Read = tuple[list[ConsumerRecord[bytes, bytes]], int]


async def read_records(consumer_options: Mapping[str, Any], topic: str,
                       partitions: Sequence[int], timeout: float,
                       starts: Mapping[int, int] | None = None) -> dict[int, Read]:
    """Each of ``partitions`` from its start (or from ``starts``' offset: one below the
    log's start reads from there, with ``auto_offset_reset`` earliest) to the high
    watermark of a fetch: its records and that high watermark. By a consumer of no group."""
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer = AIOKafkaConsumer(**{**consumer_options, "enable_auto_commit": False})
    await consumer.start()
    found: dict[int, list[ConsumerRecord[bytes, bytes]]] = {p: [] for p in partitions}
    ends: dict[int, int] = {}
    try:
        consumer.assign(tps)
        for tp in tps:
            start = (starts or {}).get(tp.partition, 0)
            if start > 0:
                consumer.seek(tp, start)
            else:
                await consumer.seek_to_beginning(tp)
        deadline = asyncio.get_running_loop().time() + timeout
        todo = set(tps)
        while todo:
            fetched = await consumer.getmany(*todo, timeout_ms=300)
            for tp, records in fetched.items():
                found[tp.partition] += records
            for tp in list(todo):
                high = consumer.highwater(tp)
                if high is not None and await consumer.position(tp) >= high:
                    ends[tp.partition] = high
                    todo.discard(tp)
            if todo and asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"topic {topic}: not read to its end in {timeout:.0f}s")
        return {p: (found[p], ends[p]) for p in partitions}
    finally:
        await consumer.stop()


async def read_to_end(consumer_options: Mapping[str, Any], topic: str,
                      partitions: Sequence[int], timeout: float,
                      starts: Mapping[int, int] | None = None
                      ) -> dict[int, tuple[list[tuple[int, bytes]], int]]:
    """``read_records`` as (offset, value) pairs, without tombstones."""
    read = await read_records(consumer_options, topic, partitions, timeout, starts)
    return {p: ([(r.offset, r.value) for r in records if r.value is not None], end)
            for p, (records, end) in read.items()}
