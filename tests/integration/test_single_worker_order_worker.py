"""A single worker over 3 partitions, SIGKILLed, replays them in its first run's order
through the merge log topic (Kafka and Redis for real).

One key per ordered pair of partitions (i, j): an early event (minute 0) on i, then,
once the worker has seen every early event, a closing one (minute 2) on j. The first
run folds every early event into its minute-0 window and passes it on to the
downstream count. A SIGTERM's snapshot writes the downstream count first and dies
(``ONCEFLOW_FAULT_KILL_AFTER_SAVE``) before the windows are written, nothing
committed. The successor gets all 12 records at once, grouped by partition whatever
their order: without the log (``ONCEFLOW_FAULT_NO_MERGE_LOG``) some partition j comes
before some i, the pair's closing event closes minute 0 first, and its early event is
late, though the downstream count, written by the first run, holds it; with the log
the replay closes every window where the first run did.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import pair_events

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.stages.state import decode_state
from onceflow.stores.redis_store import RedisStore

PARTITIONS = 3
HERE = str(Path(__file__).parent)
PAIRS = [(i, j) for i in range(PARTITIONS) for j in range(PARTITIONS) if i != j]


def events(minute: int, side: int) -> list[tuple[bytes | None, bytes]]:
    return pair_events(PARTITIONS, minute, side)


class Setup:
    def __init__(self, kafka: ServiceInfo, redis: ServiceInfo, tmp_path: Path,
                 unique_name: Callable[..., str]):
        self.kafka, self.redis, self.tmp_path = kafka, redis, tmp_path
        self.input, self.seen, self.late = (unique_name("ev"), unique_name("seen"),
                                            unique_name("late"))
        self.group, self.prefix, self.id = unique_name("g"), unique_name("p"), unique_name("o")
        for topic in (self.input, self.seen, self.late):
            asyncio.run(harness.create_topic(kafka.address, topic, PARTITIONS))
        self.store = RedisStore(f"redis://{redis.address}/0", self.prefix, self.id)
        self.workers: list[harness.WorkerProcess] = []

    def worker(self, name: str, interval: str, env: dict[str, str]) -> harness.WorkerProcess:
        settings = {"onceflow.pipeline": "ordered_windows_pipeline:pipeline",
                    "onceflow.kafka.bootstrap-servers": self.kafka.address,
                    "onceflow.kafka.group-id": self.group,
                    "onceflow.kafka.late-events-topic": self.late,
                    "onceflow.stores.redis.url": f"redis://{self.redis.address}/0",
                    "onceflow.stores.redis.key-prefix": self.prefix,
                    "onceflow.single-worker": "true",
                    "onceflow.windows.idle-timeout": "1s",  # event time: closes at minute 2
                    "onceflow.commit.interval": interval,
                    "onceflow.persistence.interval": interval}
        path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
        argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
        process = harness.WorkerProcess(
            argv, {**os.environ, "PYTHONPATH": path, "ONCEFLOW_SWO_ID": self.id,
                   "ONCEFLOW_SWO_INPUT": self.input, "ONCEFLOW_SWO_SEEN": self.seen, **env},
            self.tmp_path, name)
        process.start()
        self.workers.append(process)
        return process

    def stop(self) -> None:
        for process in self.workers:
            if process.exited() is None:
                process.kill()

    def wait_seen(self, n: int, process: harness.WorkerProcess, timeout: float = 60) -> None:
        """Until the worker has republished ``n`` events: it processed them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = asyncio.run(harness.read_all(self.kafka.address, self.seen, PARTITIONS,
                                                 quiet=0.3))
            if len(found) >= n:
                return
            assert process.exited() is None, f"worker exited: {process.log_tail()}"
        raise AssertionError(f"{n} events not seen in {timeout}s: {process.log_tail()}")

    def per_key(self) -> tuple[dict[str, int], dict[str, int]]:
        """Each key's downstream count, and its events in windows (closed and open)."""
        counted = {k: int(decode_state(v).value) for k, v in self.store.scan("counted")}
        windowed: dict[str, int] = {}
        for key, _, value in self.store.scan_history("per_minute"):
            windowed[key] = windowed.get(key, 0) + int(json.loads(value))
        for key, value in self.store.scan("per_minute"):
            state = decode_state(value).value
            windowed[key] = windowed.get(key, 0) + sum(state["open"].values())
        return counted, windowed


@pytest.mark.parametrize("naive", [False, True], ids=["merge-log", "no-merge-log"])
def test_a_replay_after_sigkill_closes_windows_where_the_first_run_did(
    naive: bool, kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    setup = Setup(kafka_service, redis_service, tmp_path, unique_name)
    faults = {"ONCEFLOW_FAULT_NO_MERGE_LOG": "1"} if naive else {}
    try:
        dying = setup.worker("dying", "1h", {**faults,
                                             "ONCEFLOW_FAULT_KILL_AFTER_SAVE": "counted"})
        asyncio.run(harness.produce(kafka_service.address, setup.input, events(0, 0)))
        setup.wait_seen(len(PAIRS), dying)
        asyncio.run(harness.produce(kafka_service.address, setup.input, events(2, 1)))
        setup.wait_seen(2 * len(PAIRS), dying)
        assert dying.terminate(60) == -signal.SIGKILL, dying.log_tail()  # in its snapshot
        counted, windowed = setup.per_key()
        assert counted == {f"k{i}{j}": 2 for i, j in PAIRS} and windowed == {}

        successor = setup.worker("successor", "300ms", faults)
        ends = {p: 2 * (PARTITIONS - 1) for p in range(PARTITIONS)}  # 2 pairs' events each
        async def drained() -> bool:
            async with harness.CommittedOffsets(kafka_service.address, setup.group) as offsets:
                return await offsets.wait_for(setup.input, ends, 60, successor)
        assert asyncio.run(drained()), successor.log_tail()
        assert successor.terminate(30) == 0, successor.log_tail()
        late = asyncio.run(harness.read_all(kafka_service.address, setup.late, PARTITIONS,
                                            quiet=1.0))
        counted, windowed = setup.per_key()
        if naive:  # late in the replay, in the window's count of the first run
            assert late and windowed != counted
            assert sum(windowed.values()) + len(late) == sum(counted.values())
            return
        assert late == []
        assert windowed == counted == {f"k{i}{j}": 2 for i, j in PAIRS}
    finally:
        setup.stop()
