"""``onceflow reconcile`` of a single worker's windows over 4 partitions replays them in the
order of the worker's merge log, not in the order it fetches them (Kafka, Redis for real).

One key per ordered pair of partitions (i, j): an early event (minute 0) on i, then,
once the worker has processed every early event, a closing one (minute 2) on j. The
worker folds each early event into its minute-0 window and closes it at minute 2.
Reconcile fetches the 24 records grouped by partition: in that order some pair's
closing event on j comes before its early event on i, the window closes first and
the early event is late, so a replay in fetch order recomputes other windows than
the stored ones (false drift, exit 1: the code before the merge log was followed).
In the logged order every row is equal (exit 0).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from helpers import pair_events, run_reconcile

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo

PARTITIONS = 4
HERE = str(Path(__file__).parent)
PAIRS = [(i, j) for i in range(PARTITIONS) for j in range(PARTITIONS) if i != j]


def events(minute: int, side: int) -> list[tuple[bytes | None, bytes]]:
    return pair_events(PARTITIONS, minute, side)


def test_reconcile_replays_a_single_workers_partitions_in_the_logged_order(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    source, seen, late = unique_name("ev"), unique_name("seen"), unique_name("late")
    for topic in (source, seen, late):
        asyncio.run(harness.create_topic(kafka_service.address, topic, PARTITIONS))
    group = unique_name("g")
    settings = {"onceflow.pipeline": "ordered_windows_pipeline:pipeline",
                "onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": group,
                "onceflow.kafka.late-events-topic": late,
                "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                "onceflow.stores.redis.key-prefix": unique_name("p"),
                "onceflow.single-worker": "true",
                "onceflow.windows.idle-timeout": "1s",
                "onceflow.commit.interval": "300ms",
                "onceflow.persistence.interval": "300ms"}
    path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ONCEFLOW_SWO_ID": unique_name("o"),
           "ONCEFLOW_SWO_INPUT": source, "ONCEFLOW_SWO_SEEN": seen}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings), env,
        tmp_path, "worker")
    worker.start()
    try:
        async def committed(ends: dict[int, int]) -> bool:
            async with harness.CommittedOffsets(kafka_service.address, group) as offsets:
                return await offsets.wait_for(source, ends, 60, worker)

        asyncio.run(harness.produce(kafka_service.address, source, events(0, 0)))
        early = {p: PARTITIONS - 1 for p in range(PARTITIONS)}
        assert asyncio.run(committed(early)), worker.log_tail()  # applied, before the closing
        asyncio.run(harness.produce(kafka_service.address, source, events(2, 1)))
        assert asyncio.run(committed({p: 2 * n for p, n in early.items()})), worker.log_tail()
        assert worker.terminate(30) == 0, worker.log_tail()
    finally:
        if worker.exited() is None:
            worker.kill()
    worker_late = asyncio.run(harness.read_all(kafka_service.address, late, PARTITIONS,
                                               quiet=0.5))
    assert worker_late == []  # the worker closed no window before its early event

    done, found = run_reconcile(settings, env, tmp_path / "report")
    context = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, context
    assert found["unordered"] == [], context
    assert found["records_read"] == 2 * len(PAIRS), context
    assert found["stages"]["counted"] == {"equal": len(PAIRS)}, context
    windows = found["stages"]["per_minute"]
    assert set(windows) == {"equal"} and windows["equal"] >= len(PAIRS), context
    assert "per_minute.late" not in found["accounting"], context
