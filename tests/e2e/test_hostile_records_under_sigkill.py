"""Hostile records mixed into a valid stream, the worker SIGKILLed twice meanwhile.

The robots pipeline (plain JSON, producer dedup on serial and seq) reads
30,000 valid reports (with ~2% re-sends) and 10,000 hostile records of every
kind in ``hostile.py`` (garbage, truncated and deeply nested JSON, tombstones,
keys no store can hold, broken or forged chain headers, a lying format
header, header names that are not UTF-8, values larger than a fetch), spread
over four partitions. Afterwards every robot's totals are exact, and the
dead-letter topic holds each hostile record (matched by its
``onceflow.source``) with the reason of its kind, once: a replay after a kill
skips the dead letters already written (``onceflow.stages.side_outputs``),
each input partition's on one dead-letter partition, in input order.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaProducer, ConsumerRecord
from helpers import raw_header_names, stored_states
from hostile import BIG, Message, generate

from onceflow.devtools import harness
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.services import ServiceInfo
from onceflow.stages.outcome import DEAD_LETTER_MAX_VALUE
from onceflow.stores.redis_store import RedisStore

PARTITIONS = 4


async def produce(bootstrap: str, topic: str, messages: list[Message], seconds: float
                  ) -> tuple[dict[int, int], dict[str, Message]]:
    """Send in order, spread over ``seconds``; end offsets and each message's source."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                enable_idempotence=False, max_request_size=4 * BIG)
    await producer.start()
    ends: dict[int, int] = {}
    placed: dict[str, Message] = {}
    chunk = max(1, len(messages) // int(seconds * 10))
    try:
        for start in range(0, len(messages), chunk):
            part = messages[start:start + chunk]
            with raw_header_names():  # the batches these sends start
                acks = [await producer.send(topic, m.value, key=m.key, partition=m.partition,
                                            headers=m.headers) for m in part]
            for m, meta in zip(part, await asyncio.gather(*acks), strict=True):
                placed[f"{topic}/{meta.partition}/{meta.offset}"] = m
                ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
            await asyncio.sleep(0.1)
    finally:
        await producer.stop()
    return ends, placed


def test_hostile_records_are_dead_lettered_and_valid_totals_stay_exact_under_sigkill(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    seed = random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    topic, dead_topic = unique_name("robots"), unique_name("dead")
    group, prefix = unique_name("g"), unique_name("p")
    for name in (topic, dead_topic):
        asyncio.run(harness.create_topic(kafka_service.address, name, PARTITIONS))
    stream = generate(topic, valid=30_000, hostile=9_995, partitions=PARTITIONS, robots=200,
                      big=5, seed=seed)
    redis_url = f"redis://{redis_service.address}/0"
    settings = {**redis_settings(kafka_service.address, redis_url, group, prefix),
                "onceflow.pipeline": "onceflow.examples.robots:pipeline",
                "onceflow.kafka.dead-letter-topic": dead_topic,
                # Snapshots 1 s apart, commits 2 s: each kill leaves hundreds of dead
                # letters written for records the replay processes again.
                "onceflow.persistence.interval": "1s",
                "onceflow.commit.interval": "2s",
                "onceflow.kafka.session-timeout": "3s",
                "onceflow.kafka.heartbeat-interval": "1s"}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings),
        {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}, tmp_path)

    async def scenario() -> tuple[dict[int, int], dict[str, Message]]:
        sent = asyncio.create_task(produce(kafka_service.address, topic, stream.messages, 20))
        await harness.kill_repeatedly(worker, 2, rng, gap=(1.0, 4.0))
        ends, placed = await sent
        async with harness.CommittedOffsets(kafka_service.address, group) as committed:
            assert await committed.wait_for(topic, ends, 120, worker), f"see {worker.logs[-1]}"
        return ends, placed

    began = time.monotonic()
    ends, placed = asyncio.run(scenario())
    assert worker.terminate(15) == 0, worker.logs[-1].read_text()[-3000:]
    dead = asyncio.run(harness.read_all(kafka_service.address, dead_topic, PARTITIONS, quiet=3))
    store = RedisStore(redis_url, prefix, "robots")
    try:
        states = stored_states(store, "per_robot")
        skipped = store.read_stats().get("side_outputs_skipped", 0)
    finally:
        store.close()
    letters: dict[str, list[tuple[bytes, dict[str, bytes]]]] = {}
    for record in dead:
        headers = dict(record.headers)
        letters.setdefault(headers["onceflow.source"].decode(), []).append(
            (record.value, headers))
    copies = sum(len(found) - 1 for found in letters.values())
    disorder = {p: _out_of_order(dead, p) for p in range(PARTITIONS)}
    context = (f"seed {seed}: {len(placed)} records, {stream.hostile} hostile, {len(dead)} "
               f"dead letters ({copies} copies from replays), {worker.kills} kills, {skipped} "
               "skipped by replays as written, "
               f"{time.monotonic() - began:.0f}s; logs in {tmp_path}")
    print(context)
    assert worker.kills == 2 and sum(ends.values()) == len(stream.messages), context
    assert skipped > 0, context  # replays met dead letters already written: it was tested
    hostile = {source: m for source, m in placed.items() if m.reason is not None}
    assert set(letters) == set(hostile), context  # each hostile record, no valid one
    twice = sorted(source for source, found in letters.items() if len(found) > 1)
    assert not twice, f"{len(twice)} dead letters written more than once, e.g. {twice[:5]}; " \
        f"{context}"
    assert disorder == dict.fromkeys(range(PARTITIONS), 0), (disorder, context)
    for source, m in hostile.items():
        value, headers = letters[source][0]
        assert m.reason is not None and m.reason in headers["onceflow.reason"].decode(), \
            (source, m, headers, context)
        assert headers["onceflow.pipeline"] == b"robots"
        if len(m.value or b"") > DEAD_LETTER_MAX_VALUE:  # larger than a fetch: cut
            assert value == (m.value or b"")[:DEAD_LETTER_MAX_VALUE], context
            assert headers["onceflow.truncated"] == str(len(m.value or b"")).encode()
        else:
            assert value == (m.value or b""), (source, context)
    assert sum(len(m.value or b"") > DEAD_LETTER_MAX_VALUE for m in hostile.values()) == \
        stream.big == 5, context
    assert states == {robot: dict(counts) for robot, counts in stream.truth.items()}, context


def _out_of_order(dead: list[ConsumerRecord[bytes, bytes]], partition: int) -> int:
    """Dead letters of input ``partition`` on another dead-letter partition or below an
    earlier one's offset: the resume relies on one partition per input, in order."""
    last, wrong = -1, 0
    for record in dead:
        topic_partition_offset = dict(record.headers)["onceflow.source"].decode()
        _, source_partition, offset = topic_partition_offset.rsplit("/", 2)
        if int(source_partition) != partition:
            continue
        if record.partition != partition % PARTITIONS or int(offset) <= last:
            wrong += 1
        last = max(last, int(offset))
    return wrong

