"""The supervision tree with the real actors: what a broker outage restarts, per policy.

The worker has two children, ``core`` (the actors that hold the states) and
``consumer`` (the Kafka stream, which depends on the core). The broker is
made unreachable (a proxy cuts every link and refuses new ones) until the
connection checker fails the stream. Under ``rest_for_one`` only the stream
is re-created and no state is read from the store again; under
``one_for_all`` the core restarts too and every key reloads. Either way the
totals are exact.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import create_topic, expected_counts, stored_states
from proxy import CuttableProxy
from recovery import drained, metric, quick_recovery

from onceflow.devtools import harness, services
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

LOADS = 'onceflow_state_loads_total{stage="per_robot"}'
STARTS = "onceflow_stream_starts_total"


@pytest.mark.parametrize("policy", ["rest_for_one", "one_for_all"])
def test_broker_outage_recreates_what_the_policy_says_and_keeps_totals_exact(
    policy: str, redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    proxy_port = services.free_port()
    kafka = services.start_tansu(tmp_path / "kafka", advertised_port=proxy_port)
    proxy = CuttableProxy(proxy_port, kafka.port)
    bootstrap = f"127.0.0.1:{proxy_port}"
    port = services.free_port()
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    worker: harness.WorkerProcess | None = None
    try:
        create_topic(bootstrap, topic, 4)
        # The same 100 robots before and after the outage: no key is new afterwards.
        first = generate(6_000, robots=100, seed=51)
        second = generate(6_000, robots=100, seed=52, after=first)
        settings = {**quick_recovery(bootstrap, redis_url, prefix),
                    "onceflow.pipeline": "onceflow.examples.robots:pipeline",
                    "onceflow.kafka.group-id": group,
                    "onceflow.supervision.policy": policy,
                    "onceflow.metrics.port": str(port)}
        worker = harness.WorkerProcess(
            harness.worker_command(harness.packaged_config("demo.conf"), settings),
            {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}, tmp_path)
        worker.start()
        ends = asyncio.run(harness.produce(bootstrap, topic, first.messages))
        asyncio.run(drained(bootstrap, group, topic, ends, worker))
        loads, starts = metric(port, LOADS), metric(port, STARTS)
        assert loads == 100 and starts == 1

        proxy.down()  # until the checker fails the stream (2 s interval, 1 retry)
        _wait(lambda: metric(port, 'onceflow_restarts_total{child="consumer"}', 0) >= 1,
              60, "the stream to be re-created", worker)
        proxy.up()

        ends = asyncio.run(harness.produce(bootstrap, topic, second.messages))
        asyncio.run(drained(bootstrap, group, topic, ends, worker))
        assert worker.exited() is None, "recovery happens inside the process"
        assert metric(port, STARTS) >= 2
        core_restarts = metric(port, 'onceflow_restarts_total{child="core"}', 0)
        if policy == "rest_for_one":  # the stream alone: the cached states stayed
            assert core_restarts == 0
            assert metric(port, LOADS) == loads, "no state was read from the store again"
        else:  # the core too: every key reloaded
            assert core_restarts >= 1
            assert metric(port, LOADS) >= loads + 100
        assert worker.terminate(15) == 0
        store = RedisStore(redis_url, prefix, "robots")
        assert stored_states(store, "per_robot") == expected_counts(first.truth, second.truth)
    finally:
        if worker is not None and worker.exited() is None:
            worker.kill()
        proxy.close()
        services.stop(kafka)


def _wait(check: Callable[[], bool], timeout: float, what: str,
          worker: harness.WorkerProcess) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"waited {timeout:.0f}s for {what}; see {worker.logs[-1]}")
