"""/health's lag reader keeps one Kafka client for its whole life.

It used to make two clients (and their connections, metadata and coordinator
look-ups) every ``metrics.lag-interval``; now one client is made at the first
reading and closed at stop, and its readings still follow the broker's high
watermarks (from fetches) and the group's commits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from helpers import create_topic, produce

from onceflow.devtools.services import ServiceInfo
from onceflow.kafka import tail_reader
from onceflow.runtime import lag
from onceflow.runtime.lag import LagWatch


def commit(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    async def run() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(list(offsets))
            await consumer.commit(offsets)
        finally:
            await consumer.stop()

    asyncio.run(run())


def wait_until(what: Callable[[], bool], why: Callable[[], Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, why()
        time.sleep(0.02)


def test_lag_watch_reads_the_real_lag_through_one_client_over_many_intervals(
        kafka_service: ServiceInfo, unique_name: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap, topic, group = kafka_service.address, unique_name("lag"), unique_name("g")
    create_topic(bootstrap, topic, 2)
    ends = produce(bootstrap, topic, [(None, b"%d" % i) for i in range(60)])
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    commit(bootstrap, group, {p0: ends[0] // 2})

    made: list[object] = []

    class Counted(AIOKafkaConsumer):  # a real client, counted
        def __init__(self, *args: Any, **kwargs: Any):
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(lag, "AIOKafkaConsumer", Counted)
    monkeypatch.setattr(tail_reader, "AIOKafkaConsumer", Counted)

    watch = LagWatch({"bootstrap_servers": bootstrap}, group, [topic], interval=0.05,
                     timeout=20).start()
    try:
        def total() -> Any:
            return watch.report()["lag"]

        expected = ends[0] - ends[0] // 2 + ends[1]
        wait_until(lambda: total() == expected, lambda: (watch.report(), expected))
        more = produce(bootstrap, topic, [(None, b"x")] * 10)  # the ends move: seen
        wait_until(lambda: total() == expected + 10, lambda: (watch.report(), more))
        commit(bootstrap, group, {p0: more[0], p1: more[1]})  # caught up: seen
        wait_until(lambda: total() == 0, lambda: watch.report())
        first = watch.readings
        wait_until(lambda: watch.readings >= first + 20, lambda: watch.readings)
        assert len(made) == 1, f"{len(made)} clients made over {watch.readings} readings"
        assert watch.report()["partitions"] == {f"{topic}:0": 0, f"{topic}:1": 0}
    finally:
        watch.stop()
    assert not watch._thread.is_alive()
    assert all(client._closed for client in made), "a client left open after stop"
