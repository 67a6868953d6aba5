"""How far a pipeline's consumer group is behind its input, read from Kafka alone.

Lag per partition is the fetched high watermark minus the group's committed
offset, so it is known with no worker running. The high watermark comes from
a fetch response (assign, seek to the committed offset, fetch): ListOffsets
(``end_offsets``) is not trusted, since some brokers (Tansu) answer it with
the last batch's base offset + 1 when batches hold several records. An offset
is committed only after the states that include it are durable, so lag 0 on
every input partition means everything produced so far is in the stores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from onceflow.actors.output_tail import fetched_high_watermarks, tail_options

__all__ = ["GroupLag", "PartitionLag", "read_lag"]


@dataclass(frozen=True)
class PartitionLag:
    """One input partition: the group's committed offset (None: nothing committed, the
    group would start at the log's start) and the high watermark."""

    topic: str
    partition: int
    committed: int | None
    end: int

    @property
    def lag(self) -> int:
        return max(0, self.end - (self.committed or 0))


@dataclass(frozen=True)
class GroupLag:
    """Every partition of the topics asked about, and the topics that do not exist."""

    group: str
    partitions: tuple[PartitionLag, ...]
    missing: tuple[str, ...]

    @property
    def total(self) -> int:
        return sum(p.lag for p in self.partitions)


def read_lag(consumer_options: Mapping[str, Any], group: str, topics: Sequence[str],
             timeout: float = 30.0) -> GroupLag:
    """The group's lag on every partition of ``topics`` (``consumer_options``: the
    worker's, for the cluster address and security)."""
    return asyncio.run(_read_lag(tail_options(consumer_options), group, topics, timeout))


async def _read_lag(options: dict[str, Any], group: str, topics: Sequence[str],
                    timeout: float) -> GroupLag:
    reader = AIOKafkaConsumer(**options, group_id=group)  # never subscribes: no join
    await reader.start()
    try:
        known = await reader.topics()
        tps = [TopicPartition(t, p) for t in topics if t in known
               for p in sorted(reader.partitions_for_topic(t) or ())]
        committed = {tp: await reader.committed(tp) for tp in tps}
    finally:
        await reader.stop()
    ends = await fetched_high_watermarks(options, committed, timeout)
    return GroupLag(group, tuple(PartitionLag(tp.topic, tp.partition, committed[tp], ends[tp])
                                 for tp in tps),
                    tuple(t for t in topics if t not in known))
