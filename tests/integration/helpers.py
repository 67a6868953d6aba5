"""Small real-service helpers shared by integration tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from onceflow.runtime.demo import demo_config, worker_command


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, partitions, 1)])
        finally:
            await admin.close()

    asyncio.run(create())


def produce(bootstrap: str, topic: str, messages: Sequence[tuple[bytes | None, bytes]]
            ) -> dict[int, int]:
    """Produce in order; returns the end offset per partition from the acks."""

    async def send() -> dict[int, int]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False,
                                    acks="all", linger_ms=5)
        await producer.start()
        try:
            acks = [await producer.send(topic, value, key=key) for key, value in messages]
            ends: dict[int, int] = {}
            for meta in await asyncio.gather(*acks):
                ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
            return ends
        finally:
            await producer.stop()

    return asyncio.run(send())


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    async def read() -> dict[int, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            return {p: await consumer.committed(TopicPartition(topic, p)) or 0
                    for p in range(partitions)}
        finally:
            await consumer.stop()

    return asyncio.run(read())


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 30):  # type: ignore[no-untyped-def]
    """Read ``expected`` records from the start of ``topic`` (no group)."""

    async def read():  # type: ignore[no-untyped-def]
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        records = []
        try:
            deadline = time.monotonic() + timeout
            while len(records) < expected and time.monotonic() < deadline:
                for recs in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(recs)
            return records
        finally:
            await consumer.stop()

    return asyncio.run(read())


def start_worker(bootstrap: str, redis_url: str, group: str, prefix: str, topic: str,
                 log: Path, extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    argv = worker_command(demo_config(), bootstrap, redis_url, group, prefix)
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}
    with log.open("wb") as out:
        return subprocess.Popen([*argv, *extra], env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for_log(proc: subprocess.Popen[bytes], log: Path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"worker exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not in log after {timeout}s:\n{log.read_text()[-3000:]}")


PYTHON = sys.executable
