"""``onceflow.kafka.consumer.isolation-level`` reaches the consumer, and Tansu serves it.

The consumer is built from a config file by ``consumer_options``, as the worker builds
its own, and reads a partition written by a plain (non-transactional) producer in
multi-record batches: with read_committed, every record, in order, at once, and then
what is written while it waits at the tail (a broker that never advanced its last
stable offset would hold a read_committed consumer back for ever; Tansu does not).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.consumer.fetcher import READ_COMMITTED, READ_UNCOMMITTED
from helpers import create_topic

from onceflow.devtools.services import ServiceInfo
from onceflow.runtime.config import load_settings
from onceflow.runtime.wiring import consumer_options

FIRST, TAIL = 3_000, 200
LEVELS = {"read_committed": READ_COMMITTED, "read_uncommitted": READ_UNCOMMITTED}


async def produce(bootstrap: str, tp: TopicPartition, start: int, count: int,
                  batch: int) -> None:
    """``count`` records in ``batch``-record produce requests (``batch`` 1: one each)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=0)
    await producer.start()
    try:
        for at in range(start, start + count, batch):
            built = producer.create_batch()
            for n in range(at, min(at + batch, start + count)):
                built.append(key=None, value=f"v{n}".encode(), timestamp=None)
            built.close()
            await (await producer.send_batch(built, tp.topic, partition=tp.partition))
    finally:
        await producer.stop()


async def read(consumer: AIOKafkaConsumer, tp: TopicPartition, count: int,
               timeout: float = 30.0) -> list[int]:
    """The offsets of the next ``count`` records (fewer if they do not come in time)."""
    offsets: list[int] = []
    deadline = time.monotonic() + timeout
    while len(offsets) < count and time.monotonic() < deadline:
        offsets += [r.offset for r in (await consumer.getmany(tp, timeout_ms=200)).get(tp, [])]
    return offsets


@pytest.mark.parametrize("level", list(LEVELS))
def test_the_configured_level_reaches_a_consumer_that_reads_every_record(
    kafka_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str], level: str,
) -> None:
    bootstrap = kafka_service.address
    topic = unique_name("iso")
    create_topic(bootstrap, topic, 1)
    tp = TopicPartition(topic, 0)
    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "onceflow.examples.robots:pipeline"\n'
                    f"onceflow.kafka.consumer.isolation-level = {level}\n")
    settings = load_settings(conf, {"onceflow.kafka.bootstrap-servers": bootstrap})
    options = consumer_options(settings)
    assert options["isolation_level"] == level

    async def run() -> tuple[int, list[int], list[int]]:
        await produce(bootstrap, tp, 0, FIRST, batch=50)
        consumer = AIOKafkaConsumer(**{**options, "group_id": None})
        await consumer.start()
        try:
            fetcher_level = consumer._fetcher._isolation_level
            consumer.assign([tp])
            consumer.seek(tp, 0)
            first = await read(consumer, tp, FIRST)
            # at the tail now: records written meanwhile, one request each and in batches
            writing = asyncio.ensure_future(produce(bootstrap, tp, FIRST, TAIL // 2, batch=1))
            tail = await read(consumer, tp, TAIL // 2)
            await writing
            await produce(bootstrap, tp, FIRST + TAIL // 2, TAIL // 2, batch=20)
            tail += await read(consumer, tp, TAIL // 2)
            return fetcher_level, first, tail
        finally:
            await consumer.stop()

    fetcher_level, first, tail = asyncio.run(run())
    assert fetcher_level == LEVELS[level]
    assert first == list(range(FIRST))
    assert tail == list(range(FIRST, FIRST + TAIL))


def test_the_default_is_read_committed(tmp_path: Path) -> None:
    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "onceflow.examples.robots:pipeline"\n')
    assert consumer_options(load_settings(conf))["isolation_level"] == "read_committed"
