"""``onceflow reconcile`` over each store, and its answer for states past the commits.

The robot pipeline (plain JSON, producer-sequence dedup, a flat-map, per-robot
counts) runs in a worker against Redis or Cassandra until its group committed
everything; reconcile must find every robot equal (exit 0) and account for the
re-sent reports and the events. ``--keys`` narrows it to the keys named. Then the
group's committed offsets are set back (as a reset of the group would): the
stored states now hold records past them, which reconcile cannot judge from its
replay: every such robot is ``ahead`` and it exits 2, never 1.

States gone by ``expire-after`` and history rows gone by ``history.retention`` (Redis
drops them, 6 s after their last write) are ``expired``, with their rule, and it exits
0; before that rule they were ``missing`` (exit 1).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from helpers import caught_up, run_reconcile

from onceflow.devtools.chaos import store_settings
from onceflow.devtools.harness import (
    WorkerProcess,
    create_topic,
    packaged_config,
    produce,
    worker_command,
)
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore
from onceflow.testing import partition_for

STAGE = "per_robot"


async def commit(bootstrap: str, group: str, offsets: Mapping[TopicPartition, int]) -> None:
    """Set the group's committed offsets as a reset of the group would: join it, commit."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False, session_timeout_ms=6000,
                                heartbeat_interval_ms=2000)
    await consumer.start()
    try:
        consumer.subscribe([next(iter(offsets)).topic])
        while consumer.assignment() != set(offsets):  # the join: answered by a poll
            await consumer.getmany(timeout_ms=200, max_records=1)
        await consumer.commit({tp: OffsetAndMetadata(n, "") for tp, n in offsets.items()})
    finally:
        await consumer.stop()


@pytest.mark.parametrize("store", ["redis", "cassandra"])
def test_reconcile_through_each_store_and_states_past_the_commits(
        store: str, request: pytest.FixtureRequest, kafka_service: ServiceInfo,
        tmp_path: Path, unique_name: Callable[..., str]) -> None:
    service: ServiceInfo = request.getfixturevalue(f"{store}_service")
    topic, group = unique_name("robots"), unique_name("g")
    settings = {**store_settings(store, service, unique_name("rec")),
                "onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": group,
                "onceflow.kafka.producer.outbox-store": store}
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic, "ONCEFLOW_ROBOTS_STORE": store}
    stream = generate(400, robots=30, seed=11, resend=0.05)
    asyncio.run(create_topic(kafka_service.address, topic, 2))
    ends = asyncio.run(produce(kafka_service.address, topic, stream.messages))
    worker = WorkerProcess(worker_command(packaged_config("demo.conf"), settings), env,
                           tmp_path)
    worker.start()

    assert caught_up(kafka_service.address, group, topic, ends, 120, worker), \
        worker.log_tail()
    assert worker.terminate(timeout=20) == 0, worker.log_tail()

    done, found = run_reconcile(settings, env, tmp_path / "all")
    context = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, context
    assert found["stages"] == {STAGE: {"equal": len(stream.truth)}}, context
    counted = found["accounting"]
    assert counted[f"{STAGE}.folded"] == stream.events, context
    assert counted["source.producer_duplicates"] == stream.resends > 0, context
    assert found["records_read"] == len(stream.messages), context

    two = sorted(stream.truth)[:2]
    done, found = run_reconcile(settings, env, tmp_path / "two", "--keys", *two)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert found["stages"] == {STAGE: {"equal": 2}}

    back = {TopicPartition(topic, p): end // 2 for p, end in ends.items()}
    asyncio.run(commit(kafka_service.address, group, back))
    done, found = run_reconcile(settings, env, tmp_path / "back")
    context = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 2, context
    verdicts = found["stages"][STAGE]
    assert set(verdicts) <= {"equal", "ahead"} and verdicts["ahead"] > 0, context
    assert found["records_read"] == sum(back.values()), context
    assert "cannot decide" in done.stdout, context


def test_states_and_history_rows_gone_by_their_expiry_are_expired_not_missing(
        kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
        unique_name: Callable[..., str]) -> None:
    """``ordered_windows_pipeline``: per key an event of minute 0 and one of minute 2 (a
    minute 0 window closes: a history row, or its event came late; minute 2 stays open:
    the windowed state is kept), then a plain count per key (its state expires)."""
    source, seen, group = unique_name("ev"), unique_name("seen"), unique_name("g")
    prefix, pipeline_id = unique_name("p"), unique_name("o")
    for topic in (source, seen):
        asyncio.run(create_topic(kafka_service.address, topic, 2))
    keys = [f"k{n}" for n in range(6)]
    messages = [(f"{key}".encode(), json.dumps({"k": key, "ts": minute * 60_000}).encode())
                for key in keys for minute in (0, 2)]
    ends = asyncio.run(produce(kafka_service.address, source, messages))
    assert set(ends) == {0, 1}  # both partitions fed
    assert all(partition_for(k.encode(), 2) in ends for k in keys)
    url = f"redis://{redis_service.address}/0"
    settings = {"onceflow.pipeline": "ordered_windows_pipeline:pipeline",
                "onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": url, "onceflow.stores.redis.key-prefix": prefix,
                "onceflow.windows.idle-timeout": "1s",
                "onceflow.state.expire-after": "6s", "onceflow.state.history.retention": "6s",
                "onceflow.commit.interval": "300ms", "onceflow.persistence.interval": "300ms"}
    here = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ONCEFLOW_SWO_ID": pipeline_id,
           "ONCEFLOW_SWO_INPUT": source, "ONCEFLOW_SWO_SEEN": seen}
    worker = WorkerProcess(worker_command(packaged_config("demo.conf"), settings), env,
                           tmp_path)
    worker.start()

    assert caught_up(kafka_service.address, group, source, ends, 60, worker), \
        worker.log_tail()
    store = RedisStore(url, prefix, pipeline_id)
    try:
        closed = len(list(store.scan_history("per_minute")))  # minute 0 windows closed
        assert len(list(store.scan("counted"))) == len(keys) and closed, worker.log_tail()
        assert worker.terminate(timeout=20) == 0, worker.log_tail()
        deadline = time.monotonic() + 30
        while list(store.scan("counted")) or list(store.scan_history("per_minute")):
            assert time.monotonic() < deadline, "Redis kept the rows past their expiry"
            time.sleep(0.5)  # Redis expires keys on its clock: nothing to await
        assert len(list(store.scan("per_minute"))) == len(keys)  # an open window: kept
    finally:
        store.close()

    done, found = run_reconcile(settings, env, tmp_path / "expired")
    context = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, context
    assert found["stages"] == {"counted": {"expired": len(keys)},
                               "per_minute": {"equal": len(keys), "expired": closed}}, context
    rules = {e["rule"].split(" s")[0] for e in found["entries"]}
    assert rules == {"expire-after 6", "history-retention 6"}, context
