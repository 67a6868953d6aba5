"""Outages of the services a worker depends on: it waits, retries, and loses nothing."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import committed, create_topic, expected_counts, stored_states
from proxy import CuttableProxy
from recovery import drained, metric, quick_recovery

from onceflow.devtools import harness, services
from onceflow.devtools.chaos import expected_windows, read_late, stored_windows
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

pytestmark = pytest.mark.waits  # make test runs it beside the Spark tests (Makefile)


def test_redis_down_for_20s_commits_nothing_meanwhile_then_catches_up_exactly(
    kafka_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    redis_dir = tmp_path / "redis"
    redis = services.start_redis(redis_dir)  # private: this test stops it
    redis_url = f"redis://{redis.address}/0"
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    create_topic(kafka_service.address, topic, 4)
    stream = generate(30_000, seed=13)
    ends: dict[int, int] = {}
    producing = threading.Thread(target=lambda: asyncio.run(
        harness.produce(kafka_service.address, topic, stream.messages, 30, ends)))
    settings = {"onceflow.pipeline": "onceflow.examples.robots:pipeline",
                "onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": redis_url,
                "onceflow.stores.redis.key-prefix": prefix}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings),
        {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}, tmp_path)
    worker.start()
    try:
        producing.start()
        asyncio.run(worker.assigned())
        time.sleep(5)
        services.stop(redis)
        time.sleep(2)  # a commit already on its way may still land
        during = [committed(kafka_service.address, group, topic, 4)]
        deadline = time.monotonic() + 18
        while time.monotonic() < deadline:
            time.sleep(1)
            during.append(committed(kafka_service.address, group, topic, 4))
        assert worker.exited() is None, "the worker must wait for the store, not die"
        assert all(sample == during[0] for sample in during), during  # no commit advanced
        redis = services.start_redis(redis_dir, port=redis.port)  # AOF: nothing lost
        producing.join()
        assert sum(during[0].values()) < sum(ends.values())
        asyncio.run(drained(kafka_service.address, group, topic, ends, worker))
        assert worker.terminate(10) == 0
        store = RedisStore(redis_url, prefix, "robots")
        assert stored_states(store, "per_robot") == expected_counts(stream.truth)
    finally:
        if worker.exited() is None:
            worker.kill()
        services.stop(redis)


def test_broker_frozen_longer_than_every_timeout_recovers_without_process_restart(
    redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    kafka = services.start_tansu(tmp_path / "kafka")  # private: this test freezes it
    port = services.free_port()
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(kafka.address, topic, 4)
    first = generate(10_000, seed=31)
    second = generate(10_000, seed=32, after=first)
    settings = {**quick_recovery(kafka.address, redis_url, prefix),
                "onceflow.pipeline": "onceflow.examples.robots:pipeline",
                "onceflow.kafka.group-id": group,
                "onceflow.metrics.port": str(port)}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    worker = harness.WorkerProcess(argv, {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic},
                                   tmp_path)
    worker.start()
    try:
        ends = asyncio.run(harness.produce(kafka.address, topic, first.messages))
        asyncio.run(drained(kafka.address, group, topic, ends, worker))
        services.freeze(kafka)
        time.sleep(40)  # past the request timeout, the session timeout and the checker
        services.thaw(kafka)
        assert worker.exited() is None, "recovery must happen inside the process"
        ends = asyncio.run(harness.produce(kafka.address, topic, second.messages))
        asyncio.run(drained(kafka.address, group, topic, ends, worker))
        starts = metric(port, "onceflow_stream_starts_total")
        assert starts >= 2, starts  # the stream was re-created
        assert worker.terminate(10) == 0
        store = RedisStore(redis_url, prefix, "robots")
        assert stored_states(store, "per_robot") == expected_counts(first.truth, second.truth)
    finally:
        services.thaw(kafka)
        if worker.exited() is None:
            worker.kill()
        services.stop(kafka)


def test_proxy_cutting_every_connection_ten_times_keeps_totals_exact(
    redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    proxy_port = services.free_port()
    kafka = services.start_tansu(tmp_path / "kafka", advertised_port=proxy_port)
    proxy = CuttableProxy(proxy_port, kafka.port)
    bootstrap = f"127.0.0.1:{proxy_port}"
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    try:
        create_topic(bootstrap, topic, 4)
        stream = generate(30_000, seed=41)
        settings = {**quick_recovery(bootstrap, redis_url, prefix),
                    "onceflow.pipeline": "onceflow.examples.robots:pipeline",
                    "onceflow.kafka.group-id": group}
        worker = harness.WorkerProcess(
            harness.worker_command(harness.packaged_config("demo.conf"), settings),
            {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}, tmp_path)
        worker.start()
        ends: dict[int, int] = {}

        async def produce_while_cutting() -> None:
            # Each chunk is acknowledged before a cut, so the test's own producer
            # never retries (a retried send could duplicate an input record);
            # the cuts hit the worker's fetches, heartbeats and commits.
            await worker.assigned()
            size = -(-len(stream.messages) // 11)  # contiguous: each robot's seq in order
            chunks = [stream.messages[i:i + size] for i in range(0, len(stream.messages), size)]
            for n, chunk in enumerate(chunks):
                await harness.produce(bootstrap, topic, chunk, 0, ends)
                if n < 10:
                    await asyncio.sleep(random.uniform(0.5, 2.0))
                    proxy.cut()

        asyncio.run(produce_while_cutting())
        assert proxy.cuts == 10
        asyncio.run(drained(bootstrap, group, topic, ends, worker))
        assert worker.exited() is None
        assert worker.terminate(10) == 0
        store = RedisStore(redis_url, prefix, "robots")
        assert stored_states(store, "per_robot") == expected_counts(stream.truth)
    finally:
        proxy.close()
        services.stop(kafka)


def test_broker_frozen_while_a_republisher_produces_then_delivers_exactly(
    redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    """The whole broker frozen while a republisher produces: the records already sent
    when it froze land in the Redis outbox (delivered first once the broker is back);
    the batches not sent yet wait for the check of their input logs, which a frozen
    broker cannot answer (``checkpoint.log_watch``: nothing leaves unchecked), and are
    replayed by the restarted pipeline. Every window downstream is exact, and the
    outbox is empty at the end. (Which of the two holds a given record depends on
    when the freeze falls; the outbox alone, deterministically:
    tests/integration/test_dead_letter_unreachable.py.)"""
    kafka = services.start_tansu(tmp_path / "kafka")
    raw, normalized = unique_name("raw"), unique_name("norm")
    prefix = unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    late_topic = unique_name("late")
    common = {**quick_recovery(kafka.address, redis_url, prefix),
              "onceflow.kafka.late-events-topic": late_topic}
    env = {**os.environ, "ONCEFLOW_CHAIN_RAW_TOPIC": raw,
           "ONCEFLOW_CHAIN_NORMALIZED_TOPIC": normalized, "ONCEFLOW_ROBOTS_STORE": "redis"}
    groups = {"republisher": unique_name("rep"), "aggregator": unique_name("agg")}
    pipelines = {"republisher": "onceflow.examples.robot_chain:normalize",
                 "aggregator": "onceflow.examples.robot_chain:windows"}
    # The republisher gives up on the frozen broker after 1 s (before its
    # connection checker restarts the pipeline) and outboxes what it sent.
    port = services.free_port()
    bounded = {"onceflow.kafka.producer.delivery-timeout": "1s",
               "onceflow.kafka.producer.retries": "1",
               "onceflow.kafka.connection-checker.check-interval": "4s",
               "onceflow.metrics.port": str(port)}
    workers = {
        name: harness.WorkerProcess(harness.worker_command(
            harness.packaged_config("demo.conf"),
            {**common, "onceflow.pipeline": pipelines[name],
             "onceflow.kafka.group-id": groups[name],
             **(bounded if name == "republisher" else {})}), env, tmp_path, name)
        for name in pipelines
    }
    outbox = RedisStore(redis_url, prefix, "robots-normalize")
    stream = generate(20_000, seed=51, disorder=0.05)
    try:
        for topic in (raw, normalized, late_topic):
            create_topic(kafka.address, topic, 4)
        workers["aggregator"].start()
        asyncio.run(workers["aggregator"].assigned())
        raw_ends = asyncio.run(harness.produce(kafka.address, raw, stream.messages))
        # The republisher starts on the whole input and the broker freezes once it has
        # processed some of it: records it fetched are still to be sent (a fixed delay
        # after the input would race a republisher that is done in a second).
        workers["republisher"].start()
        asyncio.run(workers["republisher"].assigned())
        deadline = time.monotonic() + 60
        while metric(port, "onceflow_records_total", absent=0) < 500:
            assert time.monotonic() < deadline, "the republisher processed nothing"
            time.sleep(0.01)
        services.freeze(kafka)
        deadline, outboxed = time.monotonic() + 20, 0
        while time.monotonic() < deadline:
            outboxed = max(outboxed, sum(map(len, outbox.outbox_load().values())))
            time.sleep(0.5)
        services.thaw(kafka)
        asyncio.run(drained(kafka.address, groups["republisher"], raw, raw_ends,
                             workers["republisher"]))
        norm_ends = asyncio.run(harness.read_ends(kafka.address, normalized, 4))
        asyncio.run(drained(kafka.address, groups["aggregator"], normalized, norm_ends,
                             workers["aggregator"]))
        assert outbox.outbox_load() == {}  # all delivered, and deleted once acknowledged
        logs = "".join(log.read_text() for log in workers["republisher"].logs)
        assert "child consumer failed" in logs  # its stream broke and was re-created alone
        for worker in workers.values():
            assert worker.terminate(10) == 0
        late, twice = asyncio.run(read_late(kafka.address, late_topic, 4))
        truth, _ = expected_windows(stream, late)
        assert twice == 0
        store = RedisStore(redis_url, prefix, "robots-windows")
        for stage in ("per_robot_minute", "per_robot_day"):
            found, overlaps = stored_windows(store, stage)
            assert overlaps == 0 and found == truth[stage], stage
        dups = store.read_stats().get("per_robot_minute.duplicates", 0)
        print(f"outboxed (max seen) {outboxed}, normalized {norm_ends}, duplicates {dups}")
    finally:
        services.thaw(kafka)
        for worker in workers.values():
            if worker.exited() is None:
                worker.kill()
        services.stop(kafka)
