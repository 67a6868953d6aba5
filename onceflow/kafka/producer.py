"""The aiokafka producer for republished and dead-lettered records.

Threads: the producer and its lanes (``onceflow.kafka.delivery``) live on
the shared ``EventLoopThread`` loop, in the ``ProducerActor``. The pipeline
thread hands each batch's outputs to the loop with the batch
(``coordinator.Checkpoints.hand_over``: one hand-off), where ``send`` starts
them; the checkpoint coordinator waits until they are settled (acknowledged
by the broker, or durably in the outbox) before it tells the ledger the sends
are settled and has the states written. ``adopt`` (called on the loop
by a consumer stream on every assignment) queues the outbox rows of lanes
that left other workers. A delivery that fails without an outbox to keep it
fails its future, so nothing behind it is persisted or committed. The actor
has no thread (``base.LoopActor``): the core opens and closes it.

Fencing (``kafka.produce_gate``): exclusive outputs are checked in the store
before they are handed over, every produce request right before aiokafka writes
it, and an outbox row before it is written. A worker found fenced drops what it
holds (the lanes are stopped unsent) and fails its incarnation: the
supervisor restarts it from the store and the outputs' tails.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner, murmur2

from onceflow import faults
from onceflow.actors.base import FatalHandler, LoopActor
from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import Send
from onceflow.kafka.delivery import (
    DeliverySettings,
    Lanes,
    OutboxTally,
    OutboxWriter,
)
from onceflow.kafka.produce_gate import ProduceGate
from onceflow.stages.outcome import Output
from onceflow.stages.state import TopicPartition
from onceflow.stores.base import StateStore
from onceflow.stores.fencing import Fenced, Guard
from onceflow.stores.fencing.held_epochs import OutputFence

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=16_384)
def key_hash(key: bytes) -> int:
    """murmur2 of a key, as Kafka's default partitioner uses it (``& 0x7fffffff``).

    aiokafka computes it in pure Python, ~1 us per record (10% of a
    republisher's time); keys repeat, so the last 16,384 are remembered.
    """
    return int(murmur2(key)) & 0x7FFFFFFF


class MetadataTimeout(KafkaTimeoutError):  # type: ignore[misc]  # aiokafka is untyped
    """No metadata for an output topic within ``max-block``: its batch is not sent, and the
    incarnation fails (the supervisor restarts it; the input replays from the last commit)."""


class SendAfterFailure(KafkaTimeoutError):  # type: ignore[misc]  # aiokafka is untyped
    """A batch behind one that failed to start, not sent either: sent once the broker
    answered again, its replay by the next incarnation would write it a second time."""


def key_partition(key: bytes, partitions: Sequence[int]) -> int:
    """Kafka's default partitioner for a non-null key; ``partitions`` sorted."""
    return partitions[key_hash(key) % len(partitions)]


async def all_settled(lanes: list[list[asyncio.Future[None]]]) -> None:
    """Wait until every record is settled; raise a failure if one failed.

    A lane settles its records in order, and fails every unsettled one
    together, so waiting for each lane's last record covers the rest:
    one wake-up per lane instead of a gather callback per record. The
    others are then checked (waited for, should one still be open).
    """
    try:
        await asyncio.gather(*(futures[-1] for futures in lanes if futures))
        for futures in lanes:
            for future in futures:
                await future
    except BaseException:
        for futures in lanes:  # their failures are this one: do not log them as unretrieved
            for future in futures:
                if future.done() and not future.cancelled():
                    future.exception()
        raise


class ProducerActor(LoopActor):
    """The producer on the loop: the client, its lanes and the outbox writer.

    Each batch's outputs reach it on the loop (``send``, from the checkpoint
    coordinator: no actor thread in between); the core child starts
    and stops it (``start``, ``stop``), and a failure on the loop reaches the
    supervisor.
    """

    def __init__(
        self,
        *,
        options: Mapping[str, Any],
        delivery: DeliverySettings,
        max_block: float,
        outbox: StateStore | None,
        tally: OutboxTally,
        outbox_guard: Callable[[], Guard] | None = None,
        output_fence: OutputFence | None = None,
        io: EventLoopThread,
        start_timeout: float,
        on_fatal: FatalHandler,
    ):
        super().__init__(on_fatal)
        self._options = dict(options)
        self._delivery = delivery
        self._max_block = max_block
        self._outbox_store = outbox
        self._outbox_guard = outbox_guard
        self._gate = None if output_fence is None or faults.NO_FENCING else \
            ProduceGate(output_fence, on_fatal, type(self).__name__)
        self._tally = tally
        self._start_timeout = start_timeout
        self._io = io
        self._producer: AIOKafkaProducer | None = None
        self._lanes: Lanes | None = None
        self._partitions: dict[str, list[int]] = {}
        self._partitioner = DefaultPartitioner()
        self._order: asyncio.Lock | None = None
        self._opened = asyncio.Event()  # bound to the io loop at first use
        self._sent = 0
        self._broken: BaseException | None = None  # why a send failed to start

    def start(self) -> None:
        """Open the client (from the core's start; a broker that does not answer within
        the start timeout fails the core, which the supervisor restarts)."""
        self._io.run(self.open(), timeout=self._start_timeout)

    async def open(self) -> None:
        self._producer = AIOKafkaProducer(**self._options)
        self._order = asyncio.Lock()
        guard = self._outbox_guard
        if guard is not None and self._gate is not None:
            guard = self._gate.outbox_guard(guard)
        outbox = None if self._outbox_store is None else \
            OutboxWriter(self._outbox_store, self._tally, guard)
        self._lanes = Lanes(self._send_batch, self._delivery, outbox)
        if self._gate is not None:
            self._gate.install(self._producer.client)
        self._producer.client.cluster.add_listener(self._follow)
        await self._producer.start()
        self._opened.set()

    def _follow(self, cluster: Any) -> None:
        """(on the loop: aiokafka's cluster metadata listener) Adopt the partition list of
        every cached topic the update names; the next send uses it. An update that leaves
        a topic out (asked for other topics) changes nothing."""
        for topic, known in list(self._partitions.items()):
            found = cluster.partitions_for_topic(topic)
            if not found or found == set(known):
                continue
            self._partitions[topic] = sorted(found)
            log.warning("output topic %r has %d partitions now (was %d): sends follow "
                    "from the next batch; keyed records go where Kafka's default "
                    "partitioner puts them on %d partitions, so keys move (aggregates "
                    "reading it see them on other partitions: docs/guide/republish-and-"
                    "rekeying.md, \"When an output topic grows\")",
                    topic, len(found), len(known), len(found))

    def check(self, message: Send) -> None:
        """(the pipeline thread, before it hands the batch over) Exclusive outputs are
        checked against the store (fenced: nothing in hand is ever sent, and it raises)."""
        if self._gate is None:
            return
        try:
            self._gate.check(message, self._io.loop.time())
        except Fenced:
            self._io.run(self._close(), timeout=self._start_timeout)
            raise

    async def send(self, outputs: Sequence[Output],
                   depends: frozenset[TopicPartition] = frozenset()) -> None:
        """(on the loop, from the checkpoint coordinator) Start a batch's outputs on their
        lanes; resolves once every one is settled. ``depends``: the batch's input
        partitions; no produce request goes out while one of them is no longer held."""
        with nullcontext() if self._gate is None else self._gate.sending(depends):
            await self._send(outputs)

    async def adopt(self) -> int:
        """(on the loop) Queue the outbox rows the lanes do not hold yet; how many."""
        await self._opened.wait()
        assert self._lanes is not None
        return await self._lanes.adopt()

    def pending(self, partitions: frozenset[TopicPartition]
                ) -> dict[TopicPartition, list[Output]]:
        """(on the loop) The records of these output partitions not acknowledged yet."""
        assert self._lanes is not None
        return self._lanes.pending(partitions)

    async def _send(self, outputs: Sequence[Output]) -> None:
        """Hand each record to its partition's lane, in order; wait until all are settled.

        Finding a partition may wait for topic metadata; the lock keeps the next ``Send``
        from overtaking this one meanwhile (docs/architecture.md, invariant 8), and one
        that failed there fails every later one (``SendAfterFailure``)."""
        if not self._opened.is_set():  # the actor is still opening the client
            await self._opened.wait()
        assert self._lanes is not None and self._order is not None
        cut = faults.KILL_AFTER_SENDS - self._sent
        dying = 0 < cut <= len(outputs)
        if dying:
            outputs = outputs[:cut]
        async with self._order:
            if self._broken is not None:  # batches start in order, or not at all
                raise SendAfterFailure(f"not sent: an earlier batch failed ({self._broken})")
            try:
                by_lane = await self._lanes_of(outputs)
            except BaseException as error:
                self._broken = error
                raise
            settled = [self._lanes.lane(topic, partition).add(outs)
                       for (topic, partition), outs in by_lane.items()]
            self._sent += len(outputs)
        await all_settled(settled)
        if dying:
            faults.die()

    async def _lanes_of(self, outputs: Sequence[Output]) -> dict[TopicPartition, list[Output]]:
        """The outputs by output partition, in order (metadata first, within ``max-block``)."""
        partitions = {topic: await self._partitions_of(topic)
                      for topic in {o.topic for o in outputs}}
        by_lane: dict[TopicPartition, list[Output]] = {}
        for o in outputs:  # Kafka's default partitioner (murmur2 of the key), or the step's
            if o.partition is None and o.key is not None:
                partition = key_partition(o.key, partitions[o.topic])
            elif o.partition is None:  # no key: a random partition, as Kafka does
                partition = int(self._partitioner(o.key, partitions[o.topic],
                                                  partitions[o.topic]))
            elif o.partition in partitions[o.topic]:
                partition = o.partition
            else:  # not in the cache: the topic may have grown since its last metadata
                partitions[o.topic] = await self._refreshed(o.topic)
                if o.partition not in partitions[o.topic]:
                    raise ValueError(f"partition {o.partition} of {o.topic!r} does not "
                                     f"exist (it has {len(partitions[o.topic])})")
                partition = o.partition
            by_lane.setdefault((o.topic, partition), []).append(o)
        return by_lane

    async def _partitions_of(self, topic: str) -> list[int]:
        """The topic's partitions, sorted (cached; ``_follow`` keeps them current).

        The topic joins the client's tracked topics, so every periodic refresh asks for
        it (a topic learnt from an answer about all topics would drop out of the next
        answer about the tracked ones)."""
        partitions = self._partitions.get(topic)
        if partitions is None:
            assert self._producer is not None
            self._producer.client.add_topic(topic)
            found = await self._bounded(self._producer.partitions_for(topic), topic)
            partitions = self._partitions[topic] = sorted(found)
        return partitions

    async def _refreshed(self, topic: str) -> list[int]:
        """The topic's partitions after asking the broker again (a send to a partition the
        cache does not know); ``_follow`` adopts the answer."""
        assert self._producer is not None
        await self._bounded(self._producer.client.force_metadata_update(), topic)
        return self._partitions[topic]

    async def _bounded(self, wait: Awaitable[Any], topic: str) -> Any:
        """``wait`` (for metadata), within ``max-block``, or ``MetadataTimeout``."""
        try:
            return await asyncio.wait_for(wait, self._max_block)
        except TimeoutError:
            raise MetadataTimeout(
                f"no metadata for output topic {topic!r} within max-block "
                f"({self._max_block:g}s): the broker did not answer; its records were not "
                "sent, the pipeline restarts and replays them from the last commit") from None

    async def _send_batch(self, topic: str, partition: int, outputs: Sequence[Output]) -> int:
        """Send as many of ``outputs`` as fit one batch; wait for the broker's ack."""
        assert self._producer is not None
        if topic == faults.PRODUCE_FAILS:
            raise KafkaConnectionError(f"fault injected: {topic} unreachable")
        batch = self._producer.create_batch()
        taken = 0
        for o in outputs:
            if batch.append(key=o.key, value=o.value, timestamp=None,
                            headers=list(o.headers)) is None:
                break
            taken += 1
        if not taken:
            raise ValueError(f"record too large for one batch on {topic}[{partition}]")
        acked = await asyncio.wait_for(
            self._producer.send_batch(batch, topic, partition=partition), self._max_block)
        await asyncio.shield(acked)
        return taken

    def stop(self) -> None:
        if self._producer is not None:
            self._io.run(self._close(), timeout=self._start_timeout)

    async def _close(self) -> None:
        """Stop the lanes; flush only when nothing is left unacknowledged.

        Records still in a lane must not reach the broker after this: the
        next incarnation re-sends them (from the outbox, or by replaying the
        input), and one arriving late could overtake those.
        """
        assert self._producer is not None and self._lanes is not None
        tasks = self._lanes.tasks()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._lanes.undelivered():
            await self._abort()
        else:
            await self._producer.stop()

    async def _abort(self) -> None:
        assert self._producer is not None
        producer: Any = self._producer
        producer._closed = True  # aiokafka has no public abort: stop its sender unflushed
        await producer._sender.close()
        await producer.client.close()

