"""The pipeline's input, read from the earliest retained offsets to the group's commits.

The input is every topic the worker consumes (``Pipeline.consumed_topics``): the
sources and the repartition topics, whose offsets the worker commits in the same
group.

The committed offsets are read as ``onceflow status`` reads them
(``runtime.lag.read_lag``: the group's id, no join; the high watermark from a
fetch, never from ListOffsets, which Tansu answers wrongly). The records come
from a group-less consumer (``kafka.tail_reader.tail_options``), assigned every
input partition and sought to its beginning, in chunks as they are fetched, so
nothing is held beyond one fetch.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from onceflow.kafka.tail_reader import tail_options
from onceflow.runtime.lag import read_lag
from onceflow.testing_records import Record

__all__ = ["Horizon", "Stalled", "horizon", "records_until"]


class Stalled(Exception):
    """The input stopped arriving before the committed offsets were reached."""


@dataclass(frozen=True)
class Horizon:
    """Per input partition: the group's committed offset (0: none) and the high watermark."""

    committed: dict[tuple[str, int], int]
    ends: dict[tuple[str, int], int]
    missing: tuple[str, ...]  # input topics that do not exist

    @property
    def lag(self) -> int:
        return sum(max(0, self.ends[tp] - n) for tp, n in self.committed.items())


def horizon(consumer_options: Mapping[str, Any], group: str, topics: Sequence[str],
            timeout: float) -> Horizon:
    """What the group committed on every partition of ``topics``."""
    lag = read_lag(consumer_options, group, topics, timeout)
    return Horizon({(p.topic, p.partition): p.committed or 0 for p in lag.partitions},
                   {(p.topic, p.partition): p.end for p in lag.partitions}, lag.missing)


async def records_until(consumer_options: Mapping[str, Any],
                        until: Mapping[tuple[str, int], int], heads: dict[tuple[str, int], int],
                        stall: float = 60.0) -> AsyncIterator[list[Record]]:
    """Chunks of records of every partition in ``until``, from its first retained offset
    (written to ``heads``) up to its offset there (not included).

    Raises ``Stalled`` when no record came for ``stall`` seconds before the end.
    """
    todo = {TopicPartition(t, p): end for (t, p), end in until.items() if end > 0}
    if not todo:
        return
    consumer = AIOKafkaConsumer(**tail_options(consumer_options))
    await consumer.start()
    try:
        consumer.assign(list(todo))
        await consumer.seek_to_beginning(*todo)
        last = time.monotonic()
        while todo:
            fetched = await consumer.getmany(*todo, timeout_ms=500, max_records=5000)
            chunk: list[Record] = []
            for tp, messages in fetched.items():
                end = todo.get(tp)
                if end is None:
                    continue
                for m in messages:
                    heads.setdefault((tp.topic, tp.partition), m.offset)
                    if m.offset < end:
                        chunk.append(Record(m.value or b"", topic=tp.topic, partition=tp.partition,
                                            offset=m.offset, key=m.key, headers=m.headers,
                                            timestamp=m.timestamp))
                if await consumer.position(tp) >= end:
                    heads.setdefault((tp.topic, tp.partition), end)  # all of it compacted away
                    del todo[tp]
                    consumer.pause(tp)
            if chunk:
                last = time.monotonic()
                yield chunk
            elif time.monotonic() - last > stall:
                left = ", ".join(f"{tp.topic}/{tp.partition}" for tp in todo)
                raise Stalled(f"no record of {left} for {stall:.0f} s before the committed "
                              "offset")
    finally:
        await consumer.stop()
