"""``onceflow reconcile`` on an input partition whose head the broker deleted: every key
fed from it is ``not retained`` and it exits 2, never 0 or 1 (Kafka, Redis for real).

The tests' Tansu cannot delete a head (its memory storage drops the connection on
DeleteRecords and ignores ``retention.ms``), so this test runs on noida-db's Kafka
(:mod:`onceflow.devtools.noida_kafka`), which does both. The robots pipeline
(per-robot counts) reads a two-partition topic. On partition 0, robots a0 and a1
report only in the head, b in the head and after it, c only after it; on partition
1, d0 and d1. The worker commits everything and stops: reconcile finds all six
equal (exit 0). Then the broker deletes partition 0's head, by DeleteRecords or by
retention (the head's records are an hour old, the rest new, and the topic's
``retention.ms`` is set to 30 minutes): its earliest offset moves past the head,
and reconcile names a0, a1 (stored, never replayed), b (replayed in part) and c
(equal, but fed from that partition: its state may hold records the replay never
saw) ``not retained``, d0 and d1 equal, and exits 2.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from helpers import caught_up, run_reconcile

from onceflow.devtools import harness, services
from onceflow.devtools.chaos import store_settings
from onceflow.devtools.harness import WorkerProcess, packaged_config, worker_command
from onceflow.devtools.noida_kafka import start_noida_kafka
from onceflow.devtools.robot_stream import START_MS, encode_report
from onceflow.devtools.services import ServiceInfo
from onceflow.testing import partition_for

STAGE = "per_robot"
#: A segment rolls after this long, so the head's records and the later ones lie in
#: different segments: retention deletes whole segments, never part of one.
SEGMENT = {"segment.ms": "10"}
HOUR_MS = 3_600_000


@pytest.fixture
def deleting_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceInfo]:
    """A Kafka-protocol broker that deletes a log's head (starts in well under 1 s)."""
    info = start_noida_kafka(tmp_path_factory.mktemp("noida"))
    try:
        yield info
    finally:
        services.stop(info)


def robot(name: str, partition: int) -> str:
    """A serial named ``name`` that the default partitioner puts on ``partition`` of 2."""
    return next(serial for n in range(1000)
                if partition_for((serial := f"{name}-{n}").encode(), 2) == partition)


def reports(plan: Sequence[tuple[str, int]], seqs: dict[str, int]) -> list[tuple[bytes, bytes]]:
    """One report of ``n`` ok results per (serial, n), each robot's ``seq`` counted on."""
    out = []
    for serial, n in plan:
        seq = seqs[serial] = seqs.get(serial, -1) + 1
        results = [{"ok": True, "ts": START_MS + 1000 * seq + i} for i in range(n)]
        out.append((serial.encode(), encode_report(serial, seq, results)))
    return out


async def send(bootstrap: str, topic: str, messages: Sequence[tuple[bytes, bytes]],
               timestamp_ms: int | None = None) -> dict[int, int]:
    """Produce in order, with that record timestamp (None: now); end offsets from the acks."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        acks = [await producer.send_and_wait(topic, value, key=key, timestamp_ms=timestamp_ms)
                for key, value in messages]
    finally:
        await producer.stop()
    ends: dict[int, int] = {}
    for meta in acks:
        ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
    return ends


async def delete_head(bootstrap: str, tp: TopicPartition, before: int, how: str) -> None:
    """DeleteRecords before ``before``, or a ``retention.ms`` the head's records are past."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if how == "delete-records":
            await admin.delete_records({tp: RecordsToDelete(before)})
        else:
            await admin.alter_configs([ConfigResource(
                ConfigResourceType.TOPIC, tp.topic,
                configs={**SEGMENT, "retention.ms": str(HOUR_MS // 2)})])
    finally:
        await admin.close()


async def first_offsets(bootstrap: str, tps: list[TopicPartition], want: dict[int, int],
                        timeout: float) -> dict[int, int]:
    """The earliest offsets the broker answers, polled until they are ``want`` (retention
    runs in the broker's own time) or ``timeout`` s passed."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            found = {tp.partition: n for tp, n in (await consumer.beginning_offsets(tps)).items()}
            if found == want or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.1)
    finally:
        await consumer.stop()


@pytest.mark.parametrize("how", ["delete-records", "retention"])
def test_reconcile_names_every_key_fed_from_a_deleted_head_not_retained(
        how: str, deleting_broker: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
        unique_name: Callable[..., str]) -> None:
    broker = deleting_broker.address
    topic, group = unique_name("robots"), unique_name("g")
    a0, a1, b, c = (robot(name, 0) for name in ("a0", "a1", "b", "c"))
    d0, d1 = robot("d0", 1), robot("d1", 1)
    asyncio.run(harness.create_topic(broker, topic, 2, configs=SEGMENT))
    seqs: dict[str, int] = {}
    old = int(time.time() * 1000) - HOUR_MS  # only partition 0's head is this old
    head = asyncio.run(send(broker, topic, reports([(a0, 2), (a1, 1), (b, 3), (a0, 1)], seqs),
                            old))
    head |= asyncio.run(send(broker, topic, reports([(d0, 2)], seqs)))
    assert head == {0: 4, 1: 1}
    time.sleep(0.05)  # past segment.ms: the records after the head go to a new segment
    ends = asyncio.run(send(broker, topic, reports(
        [(b, 2), (c, 1), (d1, 4), (c, 2), (d0, 1)], seqs)))
    assert ends == {0: 7, 1: 3}
    settings = {**store_settings("redis", redis_service, unique_name("rec")),
                "onceflow.kafka.bootstrap-servers": broker,
                "onceflow.kafka.group-id": group,
                "onceflow.kafka.producer.outbox-store": "redis",
                "onceflow.commit.interval": "300ms", "onceflow.persistence.interval": "300ms"}
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic, "ONCEFLOW_ROBOTS_STORE": "redis"}
    worker = WorkerProcess(worker_command(packaged_config("demo.conf"), settings), env,
                           tmp_path)
    worker.start()
    assert caught_up(broker, group, topic, ends, 60, worker), worker.log_tail()
    assert worker.terminate(timeout=20) == 0, worker.log_tail()

    done, found = run_reconcile(settings, env, tmp_path / "whole")
    context = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, context
    assert found["stages"] == {STAGE: {"equal": 6}}, context

    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    asyncio.run(delete_head(broker, tps[0], head[0], how))
    assert asyncio.run(first_offsets(broker, tps, {0: head[0], 1: 0}, 20)) == {0: 4, 1: 0}
    done, found = run_reconcile(settings, env, tmp_path / "headless")
    context = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 2, context
    verdicts = {e["key"]: e["verdict"] for e in found["entries"]}
    assert verdicts == dict.fromkeys((a0, a1, b, c), "not retained"), context
    assert found["stages"] == {STAGE: {"equal": 2, "not retained": 4}}, context
    retained = {(o["partition"], o["first_retained"]) for o in found["offsets"]}
    assert retained == {(0, 4), (1, 0)}, context
    assert found["records_read"] == (ends[0] - head[0]) + ends[1], context
    assert found["problem"] == f"input no longer retained from offset 0: {topic}/0 from 4", \
        context
