"""A partition whose log ends below the offset its group committed stops the worker.

That happens when a log is truncated (an unclean leader election) or restarts
(a topic deleted and re-created on a broker that kept the group's offsets).
Counted on, its new records would sit below the watermarks the old ones left
and be discarded as copies: a silent loss. Real Kafka answers the committed
offset with OFFSET_OUT_OF_RANGE and the client resets to the start, so
records come below the assigned position (a unit test of ``Continuity``);
Tansu answers with an empty fetch and a high watermark below it. Neither
broker can truncate a log here, so the test commits an offset beyond the end
itself, as a truncation would leave it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from helpers import committed, create_topic, produce, start_worker

from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore


async def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.commit({TopicPartition(topic, 0): offset})
    finally:
        await consumer.stop()


def test_a_log_ending_below_the_committed_offset_stops_the_worker(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    bootstrap, redis_url = kafka_service.address, f"redis://{redis_service.address}/0"
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    stream = generate(50, robots=5, seed=4)
    create_topic(bootstrap, topic, 1)
    ends = produce(bootstrap, topic, stream.messages)
    asyncio.run(_commit(bootstrap, group, topic, 400))
    log = tmp_path / "worker.log"
    started = time.monotonic()
    worker = start_worker(bootstrap, redis_url, group, prefix, topic, log,
                          ["--set", "onceflow.consumer.rewind-grace=2s"])
    try:
        code = worker.wait(90)
    finally:
        if worker.poll() is None:
            worker.kill()
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert f"{topic}[0] ends at offset {ends[0]}, below offset 400" in text, text[-3000:]
    assert time.monotonic() - started > 2  # not before the grace
    # Nothing was folded, nothing committed: the group still holds its offset.
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert list(store.scan("per_robot")) == []
    finally:
        store.close()
    assert committed(bootstrap, group, topic, 1) == {0: 400}
