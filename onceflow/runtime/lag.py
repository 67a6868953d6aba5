"""How far a pipeline's consumer group is behind its input, read from Kafka alone.

Lag per partition is the fetched high watermark minus the group's committed
offset, so it is known with no worker running. The high watermark comes from
a fetch response (assign, seek to the committed offset, fetch): ListOffsets
(``end_offsets``) is not trusted, since some brokers (Tansu) answer it with
the last batch's base offset + 1 when batches hold several records. An offset
is committed only after the states that include it are durable, so lag 0 on
every input partition means everything produced so far is in the stores.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from onceflow.actors.output_tail import fetched_high_watermarks, tail_options

__all__ = ["GroupLag", "LagWatch", "PartitionLag", "read_lag"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionLag:
    """One input partition: the group's committed offset (None: nothing committed, the
    group would start at the log's start) and the high watermark."""

    topic: str
    partition: int
    committed: int | None
    end: int

    @property
    def lag(self) -> int:
        return max(0, self.end - (self.committed or 0))


@dataclass(frozen=True)
class GroupLag:
    """Every partition of the topics asked about, and the topics that do not exist."""

    group: str
    partitions: tuple[PartitionLag, ...]
    missing: tuple[str, ...]

    @property
    def total(self) -> int:
        return sum(p.lag for p in self.partitions)


def read_lag(consumer_options: Mapping[str, Any], group: str, topics: Sequence[str],
             timeout: float = 30.0) -> GroupLag:
    """The group's lag on every partition of ``topics`` (``consumer_options``: the
    worker's, for the cluster address and security)."""
    return asyncio.run(_read_lag(tail_options(consumer_options), group, topics, timeout))


async def _read_lag(options: dict[str, Any], group: str, topics: Sequence[str],
                    timeout: float) -> GroupLag:
    reader = AIOKafkaConsumer(**options, group_id=group)  # never subscribes: no join
    await reader.start()
    try:
        known = await reader.topics()
        tps = [TopicPartition(t, p) for t in topics if t in known
               for p in sorted(reader.partitions_for_topic(t) or ())]
        committed = {tp: await reader.committed(tp) for tp in tps}
    finally:
        await reader.stop()
    ends = await fetched_high_watermarks(options, committed, timeout)
    return GroupLag(group, tuple(PartitionLag(tp.topic, tp.partition, committed[tp], ends[tp])
                                 for tp in tps),
                    tuple(t for t in topics if t not in known))


class LagWatch:
    """A running worker's view of its group's lag, as ``onceflow status`` reads it.

    A daemon thread re-reads ``read_lag`` every ``interval`` seconds, so
    /health answers from the last reading and never waits on Kafka. The lag
    is the broker's minus the group's committed offsets: it keeps growing
    while the worker restarts, loops or is fenced, where the worker's own
    counters stand still.
    """

    def __init__(self, consumer_options: Mapping[str, Any], group: str, topics: Sequence[str],
                 interval: float, timeout: float):
        self._args = (dict(consumer_options), group, tuple(topics))
        self._interval, self._timeout = interval, timeout
        self._stop = threading.Event()
        self._reading: tuple[GroupLag, float] | None = None  # replaced whole: no lock needed
        self._error: tuple[str, float] | None = None
        self._thread = threading.Thread(target=self._run, name="onceflow-lag", daemon=True)

    def start(self) -> LagWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                options, group, topics = self._args
                self._reading = (read_lag(options, group, topics, self._timeout),
                                 time.monotonic())
                self._error = None
            except Exception as error:  # the broker is down: say so, keep the last reading
                self._error = (f"{type(error).__name__}: {error}", time.monotonic())
                log.debug("reading the group's lag failed: %r", error)
            self._stop.wait(self._interval)

    def report(self, owned: Collection[tuple[str, int]] | None = None) -> dict[str, Any]:
        """``lag``: the group's total at the last reading (None before the first);
        ``assigned``: that of the ``owned`` partitions (this worker's); the reading's
        age; and the last error if the newest attempt failed."""
        reading, error, now = self._reading, self._error, time.monotonic()
        return {
            "lag": None if reading is None else reading[0].total,
            "assigned": None if reading is None or owned is None else sum(
                p.lag for p in reading[0].partitions if (p.topic, p.partition) in owned),
            "partitions": None if reading is None else {
                f"{p.topic}:{p.partition}": p.lag for p in reading[0].partitions},
            "seconds_ago": None if reading is None else round(now - reading[1], 3),
            "error": None if error is None else error[0],
        }
