"""``onceflow reconcile --from-offsets committed-at:TS``: the input written up to TS is
replayed, the states changed since are ``ahead``, never drift (Kafka, Redis for real).

``ordered_windows_pipeline`` (events per key per minute, then per key): every key gets
an event of minute 0, then, after TS, keys k0..k2 get one of minute 2 (their minute 0
windows close). The worker commits everything. Cut at TS, the replay reads the first
six records only: k3..k5 are equal, k0..k2 ahead (their states and closed windows hold
records past the cut), exit 2; without the cut every row is equal, exit 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from helpers import caught_up, run_reconcile

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo


def test_reconcile_up_to_the_input_written_by_a_time(
        kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
        unique_name: Callable[..., str]) -> None:
    source, seen, group = unique_name("ev"), unique_name("seen"), unique_name("g")
    for topic in (source, seen):
        asyncio.run(harness.create_topic(kafka_service.address, topic, 2))
    keys = [f"k{n}" for n in range(6)]

    def events(minute: int, names: list[str]) -> list[tuple[bytes | None, bytes]]:
        return [(name.encode(), json.dumps({"k": name, "ts": minute * 60_000}).encode())
                for name in names]

    first = asyncio.run(harness.produce(kafka_service.address, source, events(0, keys)))
    time.sleep(0.05)  # record timestamps are ms: TS falls strictly between the two batches
    cut_at = int(time.time() * 1000)
    time.sleep(0.05)
    later = asyncio.run(harness.produce(kafka_service.address, source,
                                        events(2, keys[:3])))
    ends = {p: max(first.get(p, 0), later.get(p, 0)) for p in (0, 1)}
    settings = {"onceflow.pipeline": "ordered_windows_pipeline:pipeline",
                "onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                "onceflow.stores.redis.key-prefix": unique_name("p"),
                "onceflow.windows.idle-timeout": "1s",
                "onceflow.commit.interval": "300ms", "onceflow.persistence.interval": "300ms"}
    here = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ONCEFLOW_SWO_ID": unique_name("o"),
           "ONCEFLOW_SWO_INPUT": source, "ONCEFLOW_SWO_SEEN": seen}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings), env, tmp_path)
    worker.start()

    assert caught_up(kafka_service.address, group, source, ends, 60, worker), \
        worker.log_tail()
    assert worker.terminate(timeout=20) == 0, worker.log_tail()

    done, found = run_reconcile(settings, env, tmp_path / "all")
    context = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, context
    assert found["records_read"] == len(keys) + 3, context

    done, found = run_reconcile(settings, env, tmp_path / "cut", "--from-offsets",
                                f"committed-at:{cut_at}")
    context = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 2, context
    assert found["records_read"] == len(keys), context  # the six written before TS
    assert {o["partition"]: o["replayed_to"] for o in found["offsets"]} == first, context
    verdicts = {(e["stage"], e["key"], e["window"]): e["verdict"] for e in found["entries"]}
    assert set(verdicts.values()) == {"ahead"}, context
    assert {key for _, key, _ in verdicts} == set(keys[:3]), context
    assert found["stages"]["counted"] == {"equal": 3, "ahead": 3}, context
    assert "input written by" in done.stdout, context
