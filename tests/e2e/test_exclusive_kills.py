"""A 1:1 exclusive republisher SIGKILLed at random points under load: its output topic
is a pristine copy (no record twice, nothing missing, in order per partition)."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import random
import re
from collections.abc import Callable
from pathlib import Path

from test_exclusive_republish import PARTITIONS, drained, expected_parts, items, written_parts

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo

SCAN = re.compile(r"replays from (\{.*?\}) skip up to (\{.*?\})\n")


def resumed_above_the_commit(logs: list[Path]) -> int:
    """Tail scans that found outputs of inputs at or above their committed offset: the
    replays that would have written them twice without the scan."""
    found = 0
    for log in logs:
        for committed, written in SCAN.findall(log.read_text(errors="replace")):
            starts, marks = ast.literal_eval(committed), ast.literal_eval(written)
            found += sum(1 for tp, mark in marks.items() if mark[0] >= starts[tp])
    return found


def test_an_exclusive_republisher_killed_ten_times_writes_a_pristine_topic(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    source, output = unique_name("in"), unique_name("out")
    for topic in (source, output):
        asyncio.run(harness.create_topic(kafka_service.address, topic, PARTITIONS))
    settings = {"onceflow.pipeline": "onceflow.examples.mirror:mirror",
                "onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": unique_name("g"),
                "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                "onceflow.stores.redis.key-prefix": unique_name("p"),
                # A restarted worker waits for the killed one's session to expire.
                "onceflow.kafka.session-timeout": "3s",
                "onceflow.kafka.heartbeat-interval": "1s"}
    env = {**os.environ, "ONCEFLOW_MIRROR_TOPIC": source, "ONCEFLOW_MIRROR_OUTPUT": output}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings), env, tmp_path,
        "mirror")
    rng = random.Random(12)
    kills = 10

    async def scenario() -> dict[int, int]:
        ends, _ = await asyncio.gather(
            harness.produce(kafka_service.address, source, items(30_000), seconds=45),
            harness.kill_repeatedly(worker, kills, rng, gap=(0.2, 2.5)))
        await drained(kafka_service, settings["onceflow.kafka.group-id"], source, ends, worker)
        return ends

    asyncio.run(scenario())
    assert worker.terminate(10) == 0
    inputs = asyncio.run(harness.read_all(kafka_service.address, source, PARTITIONS, quiet=1.0))
    outputs = asyncio.run(harness.read_all(kafka_service.address, output, PARTITIONS, quiet=1.0))
    want, got = expected_parts(inputs), written_parts(outputs)
    context = (f"{worker.kills} kills, {len(inputs)} inputs, {len(outputs)} outputs, want "
               f"{sum(map(len, want.values()))}; logs {worker.logs[0].parent}")
    assert worker.kills == kills and len(inputs) == 30_000, context
    for partition in range(PARTITIONS):
        assert len(set(got[partition])) == len(got[partition]), f"duplicates: {context}"
        assert got[partition] == want[partition], f"missing or out of order: {context}"
    # The kills did cut after outputs the commit did not cover yet: without the scan
    # the replays would have written those again.
    assert resumed_above_the_commit(worker.logs) >= 1, context
    assert all(json.loads(r.value or b"")["parts"] >= 1 for r in inputs)
