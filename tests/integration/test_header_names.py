"""A record whose header name is not UTF-8, mid-batch on a real broker: dead-lettered, no stall.

aiokafka's parser fails on such a name, and before ``kafka.tolerant_records``
every fetch of the partition failed with it: the worker restarted its stream
until the budget was spent and exited 1, nothing after it was ever folded.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from aiokafka import AIOKafkaProducer
from helpers import (
    RawName,
    committed,
    consume_all,
    create_topic,
    expected_counts,
    raw_header_names,
    start_worker,
    stored_states,
    wait_for_log,
)

from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

Record = tuple[bytes | None, bytes, list[tuple[str, bytes]]]
RAW = b"\xff\xfebad"
HOSTILE: Record = (b"intruder", json.dumps(  # folded, it would add a robot to the totals
    {"serial": "intruder", "seq": 0, "results": [{"ok": True, "ts": 1}]}).encode(),
    [("site", b"a"), (RawName(RAW), b"v")])


async def produce_batches(bootstrap: str, topic: str, batches: Sequence[Sequence[Record]]
                          ) -> None:
    """Each list of records as one record batch to partition 0, in order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False)
    await producer.start()
    try:
        for records in batches:
            with raw_header_names():
                batch = producer.create_batch()
            for key, value, headers in records:
                assert batch.append(key=key, value=value, timestamp=None,
                                    headers=headers) is not None
            await (await producer.send_batch(batch, topic, partition=0))
    finally:
        await producer.stop()


def test_a_header_name_that_is_not_utf8_is_dead_lettered_and_the_records_around_it_fold(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    dead = unique_name("dlq")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(kafka_service.address, topic, 1)
    create_topic(kafka_service.address, dead, 1)
    stream = generate(300, robots=10, seed=11)
    good: list[Record] = [(key, value, []) for key, value in stream.messages]
    # The hostile record mid-batch (offset 150): records before it in its batch too.
    asyncio.run(produce_batches(kafka_service.address, topic, [
        good[:100], [*good[100:150], HOSTILE, *good[150:200]], good[200:]]))
    log = tmp_path / "worker.log"
    worker = start_worker(kafka_service.address, redis_url, group, prefix, topic, log, [
        "--set", f'onceflow.kafka.dead-letter-topic="{dead}"',
        "--set", "onceflow.metrics.stats-interval=200ms"])
    try:
        wait_for_log(worker, log, "'records': 301", timeout=60)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=10) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    text = log.read_text()
    assert "parsing it again leniently" in text  # the path under test was taken
    letters = consume_all(kafka_service.address, dead, expected=1)
    assert [r.value for r in letters] == [HOSTILE[1]]
    headers = dict(letters[0].headers)
    assert headers["onceflow.source"] == f"{topic}/0/150".encode()
    assert headers["onceflow.reason"] == (b"header name b'\\xff\\xfebad' is not UTF-8 "
                                          b"(Kafka header names are strings)")
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert stored_states(store, "per_robot") == expected_counts(stream.truth)
    finally:
        store.close()
    assert committed(kafka_service.address, group, topic, 1) == {0: 301}
