"""The merge log topic read from a stored start, on a real broker (Tansu).

A start kept in the store names an offset of the log as it was; where the topic was
re-created since (its offsets begin again at 0), the log now ends below the start, and
the reader reads it whole rather than nothing (``KafkaMergeLog.read``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from onceflow.actors.loop import EventLoopThread
from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.kafka.merge_log_topic import KafkaMergeLog
from onceflow.stages.merge_log import Run, Start


def test_a_log_read_from_a_start_and_from_beyond_its_end(
    kafka_service: ServiceInfo, unique_name: Callable[..., str],
) -> None:
    topic = unique_name("merge-log")
    asyncio.run(harness.create_topic(kafka_service.address, topic, 1))
    io = EventLoopThread("test-merge-log")
    options = {"bootstrap_servers": kafka_service.address}
    try:
        log = KafkaMergeLog(io, topic, {**options, "enable_idempotence": False},
                            {**options, "auto_offset_reset": "earliest"}, lambda ps: 0, 10)
        first = log.append({0: [Run("payments", 0, 4)]})[0]
        second = log.append({0: [Run("payments", 5, 9)]})[0]
        assert (first.offset, second.offset) == (0, 1)
        runs = [run for append in log.read(0, Start(1, 0)) for run in append.runs]
        assert runs == [Run("payments", 5, 9)]  # from the start on
        runs = [run for append in log.read(0, Start(100, 0)) for run in append.runs]
        assert runs == [Run("payments", 0, 4), Run("payments", 5, 9)]  # whole, not nothing
        log.close()
    finally:
        io.stop()
