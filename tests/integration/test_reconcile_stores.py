"""``onceflow reconcile`` over each store, and its answer for states past the commits.

The robot pipeline (plain JSON, producer-sequence dedup, a flat-map, per-robot
counts) runs in a worker against Redis or Cassandra until its group committed
everything; reconcile must find every robot equal (exit 0) and account for the
re-sent reports and the events. ``--keys`` narrows it to the keys named. Then the
group's committed offsets are set back (as a reset of the group would): the
stored states now hold records past them, which reconcile cannot judge from its
replay: every such robot is ``ahead`` and it exits 2, never 1.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from helpers import run_reconcile

from onceflow.devtools.chaos import store_settings
from onceflow.devtools.harness import (
    CommittedOffsets,
    WorkerProcess,
    create_topic,
    packaged_config,
    produce,
    worker_command,
)
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo

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

    async def caught_up() -> bool:
        async with CommittedOffsets(kafka_service.address, group) as committed:
            return await committed.wait_for(topic, ends, 120, worker)

    assert asyncio.run(caught_up()), worker.log_tail()
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
