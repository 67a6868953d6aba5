"""The aiokafka client boundary: its partitions as the project's, and closing what an
interrupted ``stop()`` left open."""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition

from onceflow.stages.state import TopicPartition

__all__ = ["close_parts", "ours", "started"]


def ours(tp: KafkaPartition) -> TopicPartition:
    """aiokafka's partition as the project's (the ledger, continuity, messages)."""
    return tp.topic, tp.partition


async def started(consumer: AIOKafkaConsumer) -> AIOKafkaConsumer:
    """``consumer`` started; stopped again (its connections closed) when its start fails or
    is interrupted."""
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()
        raise
    return consumer


async def close_parts(consumer: AIOKafkaConsumer) -> None:
    """Close the fetcher and connections an interrupted ``stop()`` left open.

    aiokafka's ``stop()`` closes them only after the group coordinator has finished
    (a join under way included); these attributes are private: best effort.
    """
    for part in (getattr(consumer, "_fetcher", None), getattr(consumer, "_client", None)):
        if part is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(part.close(), 1.0)
