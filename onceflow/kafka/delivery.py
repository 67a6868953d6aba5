"""Ordered, time-bounded delivery: one lane per output partition, and a durable outbox.

Without idempotent producers (Tansu has none) Kafka keeps order within a
partition only while nothing fails: a batch that fails while a later batch
of its partition is in flight is overtaken, and downstream dedup then takes
the re-sent records for replays and drops them. So each ``Lane`` hands the
Kafka client one batch at a time and the next only after the broker
acknowledged it (Kafka's ``max.in.flight.requests.per.connection = 1``, per
partition).

A record not acknowledged within the delivery timeout (its retries spent)
goes to the outbox in the state store, and so does every later record of its
lane until the lane has delivered them all: the lane keeps re-sending its
head, in order, with growing backoff, and deletes from the outbox what the
broker acknowledged. The records keep their envelopes (event ids, source
chains), so a re-sent record that did arrive before is a duplicate
downstream, never a second count.

A send refused because the worker is fenced (``FencedProduce``) is not
retried: the lane fails with everything it holds, which is never sent.

A record is *settled* once acknowledged or durably in the outbox; the
producer's barrier waits for that. Input offsets wait for more: the
checkpoint ledger holds nothing committable while the outbox holds a record
(``OutboxTally`` tells it).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import islice

from aiokafka.errors import KafkaError

from onceflow.actors import metrics
from onceflow.kafka.outbox_rows import SeqClock, decode_record, encode_record, lane_name
from onceflow.stages.outcome import Output
from onceflow.stages.state import TopicPartition
from onceflow.stores.base import StateStore
from onceflow.stores.fencing import Fenced, Guard
from onceflow.stores.retry import retrying

log = logging.getLogger(__name__)


class FencedProduce(KafkaError):  # type: ignore[misc]  # aiokafka is untyped
    """A produce request of exclusive outputs refused before it was written: another
    worker holds the epochs of its inputs now. Never retried."""

    retriable = False

MAX_BATCH_RECORDS = 2000

# Delivers a prefix of the records to (topic, partition); answers how many.
SendBatch = Callable[[str, int, Sequence[Output]], Awaitable[int]]


@dataclass(frozen=True)
class DeliverySettings:
    """What the lanes need of ``onceflow.kafka.producer`` (defaults: reference.conf), seconds."""

    delivery_timeout: float
    request_timeout: float
    retries: int
    retry_backoff: float
    reconnect_backoff: float
    reconnect_backoff_max: float


class DeliveryFailed(Exception):
    """Records could not be delivered in time and there is no outbox to keep them."""


@dataclass(eq=False, slots=True)
class _Entry:
    seq: int
    output: Output
    deadline: float  # loop time by which it is acknowledged or outboxed
    settled: asyncio.Future[None]
    outboxed: bool = False  # durably in the outbox
    delivered: bool = False  # acknowledged by the broker


class OutboxTally:
    """Records in the outbox not yet acknowledged, told to ``report`` (the ledger) on change."""

    def __init__(self, report: Callable[[int], None] = lambda delta: None) -> None:
        self.value = 0
        self._report = report

    def add(self, n: int) -> None:
        self.value += n
        self._report(n)
        metrics.OUTBOX.set(self.value)


class OutboxWriter:
    """Writes records to the store's outbox in batches, off the event loop.

    Rows are keyed by lane and sequence, so a lane's rows read back in the
    order they were sent. ``tally`` counts the records in the outbox not yet
    acknowledged: commits wait for it to reach zero.
    """

    def __init__(self, store: StateStore, tally: OutboxTally,
                 guard: Callable[[], Guard] | None = None):
        self._store = store
        self._guard = guard  # the epochs held (fencing): a zombie's rows are refused
        self._pending: list[tuple[str, _Entry]] = []
        self._wake = asyncio.Event()
        self.tally = tally
        self._failed: BaseException | None = None
        self.task = asyncio.create_task(self._guarded(), name="outbox-writer")

    def put(self, lane: str, entries: Iterable[_Entry]) -> None:
        self._pending.extend((lane, e) for e in entries)
        self._wake.set()
        if self._failed is not None:
            self._fail_pending()

    async def _guarded(self) -> None:
        try:
            await self._run()
        except Exception as error:  # the store stayed down beyond every retry, or fenced
            if isinstance(error, Fenced):
                metrics.FENCED.inc()
            self._failed = DeliveryFailed(f"outbox write failed: {error!r}")
            self._fail_pending()
            raise

    def _fail_pending(self) -> None:
        assert self._failed is not None
        for _, e in self._pending:
            if not e.settled.done():
                e.settled.set_exception(self._failed)
        self._pending = []

    async def load(self) -> dict[str, list[tuple[int, Output]]]:
        """The pipeline's rows, lane -> [(seq, record)] in order."""
        rows = await asyncio.to_thread(retrying, "outbox load", self._store.outbox_load)
        return {lane: [(seq, decode_record(row)) for seq, row in entries]
                for lane, entries in rows.items()}

    async def remove(self, lane: str, entries: Sequence[_Entry]) -> None:
        keys = [(lane, e.seq) for e in entries]
        self.tally.add(-len(keys))
        await asyncio.to_thread(retrying, "outbox remove", partial(self._store.outbox_remove, keys))

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            rows = {(lane, e.seq): encode_record(e.output) for lane, e in batch if not e.delivered}
            if rows:
                guard = None if self._guard is None else self._guard()
                await asyncio.to_thread(retrying, "outbox write",
                                        partial(self._store.outbox_append, rows, guard=guard))
                metrics.OUTBOXED.inc(len(rows))
            stale: dict[str, list[_Entry]] = {}
            for lane, e in batch:
                if e.delivered:  # acknowledged while its row was being written
                    stale.setdefault(lane, []).append(e)
                    if (lane, e.seq) not in rows:
                        continue
                e.outboxed = True
                self.tally.add(1)
                if not e.settled.done():
                    e.settled.set_result(None)
            for lane, entries in stale.items():
                await self.remove(lane, [e for e in entries if e.outboxed])


class Lane:
    """One output partition's records, delivered strictly in order.

    States: *direct* (records go to Kafka, a failed batch is retried up to
    ``retries`` times within the delivery timeout) and *outboxing* (entered
    when that bound is spent; every record of the lane, queued or new, is
    written to the outbox, and the head is re-sent with backoff until the
    broker takes it; the lane returns to direct once it is empty).
    """

    def __init__(self, topic: str, partition: int, name: str, send: SendBatch,
                 settings: DeliverySettings, outbox: OutboxWriter | None, seq: SeqClock):
        self.topic, self.partition, self.name = topic, partition, name
        self._send = send
        self._settings = settings
        self._outbox = outbox
        self._queue: deque[_Entry] = deque()
        self._seq = seq
        self.outboxing = False
        self._failed: BaseException | None = None
        self._wake = asyncio.Event()
        self.task = asyncio.create_task(self._guarded(), name=f"lane {name}")

    def __len__(self) -> int:
        return len(self._queue)

    def unacknowledged(self) -> list[Output]:
        """The records the broker has not acknowledged yet, in order."""
        return [e.output for e in self._queue if not e.delivered]

    def known(self) -> set[int]:
        return {e.seq for e in self._queue}

    def restore(self, rows: Sequence[tuple[int, Output]]) -> None:
        """Records found in the outbox: queued already settled, sent before anything newer."""
        loop = asyncio.get_running_loop()
        for seq, output in rows:
            done = loop.create_future()
            done.set_result(None)
            self._queue.append(_Entry(seq, output, float("inf"), done, outboxed=True))
        if rows:
            self._seq.last = max(self._seq.last, rows[-1][0])
            self.outboxing = True
            self._wake.set()

    def add(self, outputs: Sequence[Output]) -> list[asyncio.Future[None]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.delivery_timeout
        future = loop.create_future
        entries = [_Entry(seq, output, deadline, future())
                   for seq, output in zip(self._seq.take(len(outputs)), outputs, strict=True)]
        if self._failed is not None:
            for e in entries:
                e.settled.set_exception(self._failed)
            return [e.settled for e in entries]
        self._queue.extend(entries)
        if self.outboxing:
            assert self._outbox is not None
            self._outbox.put(self.name, entries)
        self._wake.set()
        return [e.settled for e in entries]

    async def _guarded(self) -> None:
        try:
            await self._run()
        except Exception as error:  # e.g. the outbox could not be written: fail, never hang
            self._fail(DeliveryFailed(f"{self.name}: {error!r}"))
            raise

    def _fail(self, error: BaseException) -> None:
        self._failed = error
        for e in self._queue:
            if not e.settled.done():
                e.settled.set_exception(error)

    async def _run(self) -> None:
        s = self._settings
        attempts, backoff = 0, s.reconnect_backoff
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            head = list(islice(self._queue, MAX_BATCH_RECORDS))
            bound = s.request_timeout if self.outboxing else head[0].deadline - loop.time()
            try:
                taken = await asyncio.wait_for(
                    self._send(self.topic, self.partition, [e.output for e in head]),
                    max(bound, 0.001))
            except (asyncio.CancelledError, KeyboardInterrupt, FencedProduce):
                raise  # fenced: the lane fails, nothing it holds is sent
            except Exception as error:
                metrics.PRODUCE_FAILURES.labels(self.topic).inc()
                if not self.outboxing:
                    attempts += 1
                    if attempts <= s.retries and loop.time() + s.retry_backoff < head[0].deadline:
                        log.log(logging.WARNING if attempts == 1 else logging.DEBUG,
                                "%s: delivery failed (%r), retry %d", self.name, error, attempts)
                        await asyncio.sleep(s.retry_backoff)
                        continue
                    self._give_up(error, attempts)
                    if self._failed is not None:
                        return
                log.debug("%s: outbox re-send failed (%r)", self.name, error)
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, s.reconnect_backoff_max)
                continue
            attempts, backoff = 0, s.reconnect_backoff
            delivered = [self._queue.popleft() for _ in range(taken)]
            for e in delivered:
                e.delivered = True
                if not e.settled.done():
                    e.settled.set_result(None)
            if self._outbox is not None and any(e.outboxed for e in delivered):
                await self._outbox.remove(self.name, [e for e in delivered if e.outboxed])
            if self.outboxing and not self._queue:
                self.outboxing = False
                log.info("%s: outbox delivered, back to direct sends", self.name)

    def _give_up(self, error: BaseException, attempts: int) -> None:
        """The bound is spent: outbox every queued record, or fail them all without one."""
        if self._outbox is None:
            self._fail(DeliveryFailed(
                f"{self.name}: {len(self._queue)} records not delivered after {attempts} "
                f"attempts within {self._settings.delivery_timeout:g}s: {error!r}"))
            log.error("%s", self._failed)
            return
        pending = [e for e in self._queue if not e.settled.done()]
        log.warning("%s: %d records not delivered after %d attempts (%r): to the outbox, "
                    "re-sent in order from there", self.name, len(self._queue), attempts, error)
        self.outboxing = True
        self._outbox.put(self.name, pending)


@dataclass
class Lanes:
    """Every lane of one producer, created on first use."""

    send: SendBatch
    settings: DeliverySettings
    outbox: OutboxWriter | None
    by_partition: dict[TopicPartition, Lane] = field(default_factory=dict)
    seq: SeqClock = field(default_factory=SeqClock)

    def lane(self, topic: str, partition: int) -> Lane:
        lane = self.by_partition.get((topic, partition))
        if lane is None:
            lane = Lane(topic, partition, lane_name(topic, partition), self.send,
                        self.settings, self.outbox, self.seq)
            self.by_partition[topic, partition] = lane
        return lane

    async def adopt(self) -> int:
        """Queue the outbox rows these lanes do not hold yet; answers how many.

        Called on every partition assignment, before anything of those
        partitions is fetched (so nothing newer of theirs can go first): the
        first one takes the whole outbox, later ones the rows of a worker
        that left.
        """
        if self.outbox is None:
            return 0
        adopted = 0
        for name, rows in (await self.outbox.load()).items():
            partition = int(name.rsplit("|", 1)[1])
            lane = self.lane(rows[0][1].topic, partition)
            known = lane.known()
            new = [(seq, output) for seq, output in rows if seq not in known]
            lane.restore(new)
            adopted += len(new)
        self.outbox.tally.add(adopted)
        return adopted

    def undelivered(self) -> int:
        return sum(map(len, self.by_partition.values()))

    def pending(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, list[Output]]:
        """The records of these partitions not acknowledged yet (queued, or outboxed and
        being re-sent), in order: they reach the broker before anything sent later."""
        return {tp: lane.unacknowledged()
                for tp in partitions if (lane := self.by_partition.get(tp)) is not None}

    def tasks(self) -> list[asyncio.Task[None]]:
        lanes = [lane.task for lane in self.by_partition.values()]
        return lanes + ([self.outbox.task] if self.outbox is not None else [])
