"""A stage that keeps failing: supervised restarts with growing delays, then escalation."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    committed,
    create_topic,
    expected_counts,
    produce,
    start_worker,
    stored_states,
    wait_for_log,
)
from recovery import series

from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo, free_port
from onceflow.stores.redis_store import RedisStore

pytestmark = pytest.mark.waits  # make test runs it beside the Spark tests (Makefile)

RESTART = re.compile(r"restarting \['core', 'consumer'\] in ([\d.]+)s")


def test_failing_stage_restarts_with_backoff_then_exits_nonzero_and_loses_nothing(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(kafka_service.address, topic, 2)
    first = generate(3_000, robots=200, seed=9)
    second = generate(3_000, robots=200, seed=10, fleet="spare")
    first_ends = produce(kafka_service.address, topic, first.messages)
    port = free_port()
    supervision = ["--set", "onceflow.supervision.max-restarts=3",
                   "--set", "onceflow.supervision.backoff.initial=300ms",
                   "--set", "onceflow.supervision.backoff.jitter=0s",
                   "--set", "onceflow.supervision.escalation-grace=3s",
                   "--set", f"onceflow.metrics.port={port}"]
    log = tmp_path / "failing.log"
    # Records of the second part come from the "spare" robots: the stage
    # fails on every batch holding one, in every incarnation.
    os.environ["ONCEFLOW_FAULT_STAGE_RAISES_ON"] = '"serial":"spare-'
    try:
        failing = start_worker(kafka_service.address, redis_url, group, prefix, topic, log,
                               supervision)
    finally:
        del os.environ["ONCEFLOW_FAULT_STAGE_RAISES_ON"]
    asyncio.run(_wait_committed(kafka_service.address, group, topic, first_ends))
    health, body = get(port, "/health")
    assert health == 200 and json.loads(body)["children"] == {"core": "running",
                                                             "consumer": "running"}
    text = get(port, "/metrics")[1]
    for name in ("onceflow_records_total", "onceflow_persisted_states_total",
                 "onceflow_committed_offset", "onceflow_consumer_lag",
                 "onceflow_store_write_seconds", "onceflow_duplicates_discarded"):
        assert name in text, name
    found = series(text)
    assert 'onceflow_folded_total{stage="per_robot"}' in found
    assert 'onceflow_cached_state_encoded_bytes{stage="per_robot"}' in found
    assert found["onceflow_stream_starts_total"] == 1.0
    assert found["onceflow_outbox_records"] == 0.0
    assert found['onceflow_cached_states{stage="per_robot"}'] == 200.0  # every robot, cached
    status = subprocess.run([sys.executable, "-m", "onceflow", "status", "--url",
                             f"http://127.0.0.1:{port}"], capture_output=True, text=True,
                            timeout=30, check=False)
    assert status.returncode == 0, status.stderr
    assert '"healthy": true' in status.stdout and "onceflow_records_total" in status.stdout
    ends = produce(kafka_service.address, topic, second.messages)
    escalated = False
    while failing.poll() is None:  # /health turns 503 once the budget is exhausted
        try:
            code_, body = get(port, "/health")
            if code_ == 503 and json.loads(body)["escalated"]:
                escalated = True
                found = series(get(port, "/metrics")[1])
                # rest_for_one: a stage failure restarts the core and the stream on it
                assert found['onceflow_restarts_total{child="core"}'] == 3.0
                assert found['onceflow_restarts_total{child="consumer"}'] == 3.0
                assert found["onceflow_stream_starts_total"] == 4.0  # re-created 3 times
                break
        except OSError:
            pass
        time.sleep(0.1)
    assert escalated  # seen with 503 during the grace period, before the exit
    code = failing.wait(timeout=180)
    text = log.read_text()
    assert code == 1, text[-3000:]
    delays = [float(d) for d in RESTART.findall(text)]
    assert len(delays) == 3, text[-3000:]  # the budget: three restarts, then escalation
    assert delays == sorted(delays) and delays[-1] >= 2 * delays[0], delays
    assert "restart budget exhausted" in text
    # Committed offsets cover what was persisted before the failures, and no more.
    assert committed(kafka_service.address, group, topic, 2) == first_ends

    # A healthy worker finishes the job from what was committed: exact totals.
    log2 = tmp_path / "healthy.log"
    healthy = start_worker(kafka_service.address, redis_url, group, prefix, topic, log2,
                           ["--set", "onceflow.metrics.stats-interval=200ms"])
    try:
        asyncio.run(_wait_committed(kafka_service.address, group, topic, ends))
        wait_for_log(healthy, log2, "partitions assigned: [(", 30)
        healthy.terminate()
        assert healthy.wait(timeout=15) == 0
    finally:
        if healthy.poll() is None:
            healthy.kill()
    store = RedisStore(redis_url, prefix, "robots")
    assert stored_states(store, "per_robot") == expected_counts(first.truth, second.truth)


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def _wait_committed(bootstrap: str, group: str, topic: str, ends: dict[int, int]) -> None:
    from onceflow.devtools.harness import CommittedOffsets

    async with CommittedOffsets(bootstrap, group) as offsets:
        assert await offsets.wait_for(topic, ends, 120)
