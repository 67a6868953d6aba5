"""A consumer stream whose fetch loop failed leaves its group before the next one joins.

The supervisor re-creates a failed stream (a broker that starves fetches,
``FetchStarved``; a lost connection). Its stop awaited the fetch task to end
it, and the task's own failure re-raised there, before the Kafka consumer was
stopped: the old consumer stayed a member of the group (its heartbeats run on
the worker's shared loop), the roundrobin assignor gave it half the
partitions beside the new stream, and nothing fetched them until
``max.poll.interval`` (5 min) evicted it: a stall with /health green, seen
against Tansu in the 1,000,000-record benchmarks. Here the first stream
fails after its first batch (a test-only fault switch); every record must
still be committed well within that interval.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import committed, create_topic, produce

from onceflow.devtools import harness
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo

PARTITIONS = 4


def test_a_failed_stream_leaves_the_group_and_every_partition_goes_on(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    create_topic(kafka_service.address, topic, PARTITIONS)
    ends = produce(kafka_service.address, topic, generate(4_000, seed=5).messages)
    config = tmp_path / "app.conf"
    config.write_text(
        f'include file("{harness.packaged_config("demo.conf")}")\n'
        "onceflow {\n"
        f'  kafka {{ bootstrap-servers = "{kafka_service.address}", group-id = "{group}",'
        " max-poll-records = 100 }\n"
        f'  stores.redis {{ url = "redis://{redis_service.address}/0", '
        f'key-prefix = "{prefix}" }}\n'
        "  commit.interval = 200ms\n"
        "  persistence.interval = 200ms\n"
        "}\n")
    monkeypatch.setenv("ONCEFLOW_ROBOTS_TOPIC", topic)
    monkeypatch.setenv("ONCEFLOW_FAULT_FETCH_FAILS_AFTER", "1")
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        argv = harness.fault_aware(harness.worker_command(config, {}), os.environ)
        worker = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        # Well inside max.poll.interval (300 s), which alone evicted the old stream.
        deadline, offsets = time.monotonic() + 90, {}
        while time.monotonic() < deadline and worker.poll() is None:
            offsets = committed(kafka_service.address, group, topic, PARTITIONS)
            if offsets == ends:
                break
            time.sleep(0.5)
        text = log.read_text()
        assert "child consumer failed: InjectedFailure" in text, text[-3000:]
        assert offsets == ends, (offsets, ends, text[-4000:])
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait(timeout=60)
