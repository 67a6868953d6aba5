"""How far a pipeline's consumer group is behind its input, read from Kafka alone.

Lag per partition is the fetched high watermark minus the group's committed
offset, so it is known with no worker running. The high watermark comes from
a fetch response (assign, seek, fetch): ListOffsets (``end_offsets``) is not
trusted, since some brokers (Tansu) answer it with the last batch's base
offset + 1 when batches hold several records. An offset is committed only
after the states that include it are durable, so lag 0 on every input
partition means everything produced so far is in the stores.

A running worker reads it every ``metrics.lag-interval`` through one
long-lived client (``LagReader``): a metadata request, the committed offsets
and one fetch per reading, over connections opened once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from onceflow.kafka.kafka_parts import started
from onceflow.kafka.tail_reader import fetch_until_answered, tail_options

__all__ = ["GroupLag", "LagReader", "LagWatch", "PartitionLag", "read_lag"]

log = logging.getLogger(__name__)

STOP_WAIT = 1.0  # longest a stop waits for the client's close (a frozen broker: not longer)


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
    return asyncio.run(_read_once(LagReader(consumer_options, group, topics, timeout)))


async def _read_once(reader: LagReader) -> GroupLag:
    try:
        return await reader.read()
    finally:
        await reader.close()


class LagReader:
    """Reads the group's lag again and again through one client, kept between readings.

    The client has the group's id but never subscribes (no join): it reads the
    committed offsets, and fetches the input partitions, paused between readings
    so nothing is fetched in the background. A reading seeks each partition to its
    last high watermark (first: the committed offset), so a caught-up fetch carries
    the high watermark and almost no records. A new client is made only when the
    partitions change (aiokafka's consumer hung in ``stop`` after one that fetched
    several partitions was re-assigned) or after ``close`` (the owner closes it
    after a failed reading).
    """

    def __init__(self, consumer_options: Mapping[str, Any], group: str,
                 topics: Sequence[str], timeout: float):
        self._options = tail_options(consumer_options)
        self._group, self._topics, self._timeout = group, tuple(topics), timeout
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._highs: dict[TopicPartition, int] = {}
        self.clients = 0  # clients created so far: one while the partitions stay the same

    async def read(self) -> GroupLag:
        consumer = await self._client()
        # a fresh metadata request: the client's own metadata covers only what it assigned
        cluster = await consumer._client.fetch_all_metadata()
        known = cluster.topics()
        tps = [TopicPartition(t, p) for t in self._topics if t in known
               for p in sorted(cluster.partitions_for_topic(t) or ())]
        committed = {tp: await consumer.committed(tp) for tp in tps}
        ends = await self._high_watermarks(committed)
        return GroupLag(self._group,
                        tuple(PartitionLag(tp.topic, tp.partition, committed[tp], ends[tp])
                              for tp in tps),
                        tuple(t for t in self._topics if t not in known))

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        self._assigned, self._highs = frozenset(), {}
        if consumer is not None:
            await consumer.stop()

    async def _client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self.clients += 1
            self._consumer = await started(
                AIOKafkaConsumer(**self._options, group_id=self._group))
        return self._consumer

    async def _high_watermarks(self, starts: Mapping[TopicPartition, int | None]
                               ) -> dict[TopicPartition, int]:
        """Each partition's high watermark from one fetch of all of them (an idle partition
        answers only after the fetch wait: one wait, not one per partition)."""
        if not starts:
            return {}
        tps = list(starts)
        if frozenset(tps) != self._assigned:
            if self._assigned:
                await self.close()
            consumer = await self._client()
            consumer.assign(tps)
            consumer.pause(*tps)  # before any await: the fetcher has not started on them
            self._assigned = frozenset(tps)
        consumer = await self._client()
        for tp, offset in starts.items():
            consumer.seek(tp, self._highs.get(tp, offset or 0))
        before = {tp: consumer.last_poll_timestamp(tp) for tp in tps}  # a new fetch changes it
        consumer.resume(*tps)
        try:  # answered: a new fetch of it came back since this reading began
            await fetch_until_answered(
                consumer, tps, lambda tp: consumer.last_poll_timestamp(tp) != before[tp]
                and consumer.highwater(tp) is not None, self._timeout)
        finally:
            consumer.pause(*tps)
        self._highs = {tp: int(consumer.highwater(tp)) for tp in tps}
        return dict(self._highs)


class LagWatch:
    """A running worker's view of its group's lag, as ``onceflow status`` reads it.

    A daemon thread reads it every ``interval`` seconds through one ``LagReader``
    (its client made once, closed at ``stop``), so /health answers from the last
    reading and never waits on Kafka. The lag is the broker's minus the group's
    committed offsets: it keeps growing while the worker restarts, loops or is
    fenced, where the worker's own counters stand still.
    """

    def __init__(self, consumer_options: Mapping[str, Any], group: str, topics: Sequence[str],
                 interval: float, timeout: float):
        self.reader = LagReader(consumer_options, group, topics, timeout)
        self._interval, self._timeout = interval, timeout
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._reading: tuple[GroupLag, float] | None = None  # replaced whole: no lock needed
        self._error: tuple[str, float] | None = None
        self.readings = 0  # successful readings so far
        self._thread = threading.Thread(target=self._run, name="onceflow-lag", daemon=True)

    def start(self) -> LagWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop reading and close the client (waits up to ``STOP_WAIT`` for it)."""
        self._stop.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with suppress(RuntimeError):  # the loop has closed already
                loop.call_soon_threadsafe(task.cancel)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT)

    def _run(self) -> None:
        with suppress(asyncio.CancelledError):
            asyncio.run(self._watch())

    async def _watch(self) -> None:
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        try:
            while not self._stop.is_set():
                try:
                    lag = await asyncio.wait_for(self.reader.read(), self._timeout)
                    self._reading, self._error = (lag, time.monotonic()), None
                    self.readings += 1
                except Exception as error:  # the broker is down: say so, keep the last reading
                    self._error = (f"{type(error).__name__}: {error}", time.monotonic())
                    log.debug("reading the group's lag failed: %r", error)
                    await self.reader.close()  # the next reading starts from a new client
                await asyncio.sleep(self._interval)
        finally:
            with suppress(Exception):
                await self.reader.close()

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
