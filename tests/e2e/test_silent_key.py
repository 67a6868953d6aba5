"""A key that goes silent still closes its last window, once, across SIGKILLs."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from onceflow.analytics.landing import read_landing
from onceflow.devtools import harness
from onceflow.devtools.chaos import expected_windows, stored_windows
from onceflow.devtools.robot_stream import START_MS, fastening_events, generate
from onceflow.devtools.services import ServiceInfo
from onceflow.examples.robot_chain import MINUTE_STAGE
from onceflow.stages.state import decode_state
from onceflow.stores.redis_store import RedisStore

SILENT = "robot-0007"
SILENT_AFTER_MS = 120_000  # its last event is in the input's first two minutes


def test_a_silent_keys_last_window_lands_once_across_sigkills(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    # 50 robots over 10 minutes of event time; robot-0007 stops after 2. Under the per-key
    # rule its last window never closed (no later event of its own). The aggregator is
    # SIGKILLed four times while the events arrive, so its state is at times only in the
    # store, and the sweep that closes it runs in a restarted worker.
    topic, group, prefix = unique_name("events"), unique_name("g"), unique_name("p")
    landing = tmp_path / "landing"
    stream = generate(12_000, robots=50, seed=random.SystemRandom().randrange(10**6))
    events = [(key, value) for key, value in fastening_events(stream)
              if key != SILENT.encode()
              or json.loads(_payload(value))[2] < START_MS + SILENT_AFTER_MS]
    truth, _ = expected_windows(stream)
    want = {slot: counts for slot, counts in truth[MINUTE_STAGE].items()
            if slot[0] != SILENT or slot[1] < START_MS + SILENT_AFTER_MS}
    silent = {slot: counts for slot, counts in want.items() if slot[0] == SILENT}
    assert silent, "the silent robot sent something first"
    asyncio.run(harness.create_topic(kafka_service.address, topic, 2))
    settings = {"onceflow.pipeline": "onceflow.examples.robot_chain:windows",
                "onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                "onceflow.stores.redis.key-prefix": prefix,
                "onceflow.landing.dir": str(landing),
                "onceflow.windows.idle-timeout": "5s"}
    env = {**os.environ, "ONCEFLOW_CHAIN_NORMALIZED_TOPIC": topic, "ONCEFLOW_ROBOTS_STORE": "redis"}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings), env, tmp_path,
        "aggregator")

    async def run() -> dict[int, int]:
        producing = asyncio.create_task(
            harness.produce(kafka_service.address, topic, events, seconds=20.0))
        await harness.kill_repeatedly(worker, 4, random.Random(), gap=(1.0, 4.0))
        ends = await producing
        async with harness.CommittedOffsets(kafka_service.address, group) as committed:
            assert await committed.wait_for(topic, ends, 120, worker), f"see {worker.logs[-1]}"
        return ends

    asyncio.run(run())
    assert worker.terminate(10) == 0
    assert worker.kills == 4
    store = RedisStore(f"redis://{redis_service.address}/0", prefix, "robots-windows")
    found, overlaps = stored_windows(store, MINUTE_STAGE)
    assert overlaps == 0 and found == want
    history = {(key, start): Counter(json.loads(value))
               for key, start, value in store.scan_history(MINUTE_STAGE) if key == SILENT}
    assert history == silent  # every window of the silent robot closed, its last too
    state = dict(store.scan(MINUTE_STAGE))[SILENT]
    assert decode_state(state).value["open"] == {}
    copies = [row for row in read_landing(landing)
              if row["stage"] == MINUTE_STAGE and row["key"] == SILENT]
    assert {(row["key"], row["window_start"]) for row in copies} == set(silent)
    for row in copies:  # a copy after a replay is equal (readers keep one per window)
        assert Counter(json.loads(row["value"])) == silent[(row["key"], row["window_start"])]


def _payload(value: bytes) -> bytes:
    from onceflow.protos.envelope_pb2 import Envelope

    return Envelope.FromString(value).payload
