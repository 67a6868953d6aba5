"""A rebalance that cannot complete: /health reports it and the consumer is re-created.

The local broker once kept a group without a leader for minutes after a
member left during a rebalance. That broker bug is not reproducible on
demand, so the test makes the same situation certain: a proxy in front of a
private broker stops forwarding JoinGroup requests (the broker never sees
them, nothing answers), then a second member leaves, which starts a
rebalance the worker can never complete. Every other request still works,
so the connection checker sees a healthy broker: only the join timeout
notices.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from helpers import committed, create_topic, expected_counts, produce, stored_states
from proxy import CuttableProxy
from recovery import metric

from onceflow.actors.loop import EventLoopThread
from onceflow.devtools import harness, services
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

pytestmark = pytest.mark.waits  # make test runs it beside the Spark tests (Makefile)

JOIN_GROUP = 11  # Kafka API key
JOIN_TIMEOUT = 8.0


def health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def wait_until(what: str, check: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:  # the endpoint is not up yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout}s\n{log.read_text()[-4000:]}")


def test_a_rebalance_that_cannot_complete_is_reported_and_the_consumer_re_created(
    redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    proxy_port, port = services.free_port(), services.free_port()
    kafka = services.start_tansu(tmp_path / "kafka", advertised_port=proxy_port)
    proxy = CuttableProxy(proxy_port, kafka.port)
    bootstrap = f"127.0.0.1:{proxy_port}"  # every connection, the coordinator's too
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    member_io = EventLoopThread("test-member")
    worker: harness.WorkerProcess | None = None
    try:
        create_topic(bootstrap, topic, 4)
        first = generate(2_000, seed=51)
        second = generate(2_000, seed=52, after=first)
        ends = produce(bootstrap, topic, first.messages)
        settings = {"onceflow.pipeline": "onceflow.examples.robots:pipeline",
                    "onceflow.kafka.bootstrap-servers": bootstrap,
                    "onceflow.kafka.group-id": group,
                    "onceflow.stores.redis.url": redis_url,
                    "onceflow.stores.redis.key-prefix": prefix,
                    "onceflow.kafka.request-timeout": "5s",
                    "onceflow.kafka.join-timeout": f"{JOIN_TIMEOUT:.0f}s",
                    "onceflow.metrics.port": str(port)}
        worker = harness.WorkerProcess(
            harness.worker_command(harness.packaged_config("demo.conf"), settings),
            {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}, tmp_path)
        worker.start()
        log = worker.logs[-1]
        wait_until("first records committed", lambda: committed(
            bootstrap, group, topic, 4) == {p: ends.get(p, 0) for p in range(4)}, 60, log)
        code, report = health(port)
        assert code == 200 and report["consumer"]["joining"] is False, report
        starts = metric(port, "onceflow_stream_starts_total")

        # A second member joins (that rebalance completes); then JoinGroup
        # requests vanish and the member leaves: the worker must rejoin, and cannot.
        async def join() -> AIOKafkaConsumer:
            member = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                      session_timeout_ms=6000, heartbeat_interval_ms=2000,
                                      enable_auto_commit=False)
            await member.start()
            return member

        member = member_io.run(join(), timeout=60)
        proxy.drop = frozenset({JOIN_GROUP})
        member_io.run(member.stop(), timeout=30)
        stuck = time.monotonic()

        wait_until("/health shows the join", lambda: health(port)[1]["consumer"]["joining"],
                   20, log)
        code, report = health(port)
        assert report["consumer"]["joining_since"] is not None, report
        overdue: list[tuple[int, dict[str, Any]]] = []

        def reported_overdue() -> bool:
            code, report = health(port)
            if report["consumer"] and report["consumer"]["join_overdue"]:
                overdue.append((code, report))
            return bool(overdue)

        wait_until("/health says the join is overdue", reported_overdue, JOIN_TIMEOUT + 20, log)
        code, report = overdue[0]
        assert code == 503 and report["healthy"] is False, report
        assert report["consumer"]["joining_seconds"] > JOIN_TIMEOUT, report
        assert time.monotonic() - stuck > JOIN_TIMEOUT
        wait_until("a new consumer", lambda: metric(
            port, "onceflow_stream_starts_total") > starts, 30, log)
        assert metric(port, "onceflow_join_timeouts_total") >= 1
        assert "group join not complete after" in log.read_text()

        # Records produced meanwhile wait; once joins work again, the
        # re-created consumer joins and every record is counted once.
        for partition, end in produce(bootstrap, topic, second.messages).items():
            ends[partition] = max(ends.get(partition, 0), end)
        proxy.drop = frozenset()
        wait_until("all records committed", lambda: committed(
            bootstrap, group, topic, 4) == {p: ends.get(p, 0) for p in range(4)}, 90, log)
        wait_until("healthy again", lambda: health(port)[0] == 200, 30, log)
        assert worker.terminate(20) == 0
        store = RedisStore(redis_url, prefix, "robots")
        try:
            assert stored_states(store, "per_robot") == expected_counts(first.truth,
                                                                         second.truth)
        finally:
            store.close()
    finally:
        if worker is not None and worker.exited() is None:
            worker.kill()
        member_io.stop()
        proxy.close()
        services.stop(kafka)
