"""ProducerActor: the aiokafka producer for republished and dead-lettered records.

Threads: messages arrive on the actor's thread; the producer lives on the
shared ``EventLoopThread`` loop. ``Send`` enqueues records without waiting;
``Barrier`` answers once everything sent before it is acknowledged, which
is what the persistence actor waits for before offsets may be committed.
A failed delivery fails the barrier, so nothing behind it is committed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from onceflow.actors import faults
from onceflow.actors.base import FatalHandler, ReportingActor
from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import Barrier, Send
from onceflow.stages.runner import Output


class ProducerActor(ReportingActor):
    def __init__(
        self,
        *,
        options: Mapping[str, Any],
        io: EventLoopThread,
        start_timeout: float,
        on_fatal: FatalHandler,
    ):
        super().__init__(on_fatal)
        self._options = dict(options)
        self._start_timeout = start_timeout
        self._io = io
        self._producer: AIOKafkaProducer | None = None
        self._pending: list[concurrent.futures.Future[None]] = []
        self._order: asyncio.Lock | None = None
        self._sent = 0
        self._failed = False

    def start_up(self) -> None:
        self._io.run(self._open(), timeout=self._start_timeout)

    async def _open(self) -> None:
        self._producer = AIOKafkaProducer(**self._options)
        self._order = asyncio.Lock()
        await self._producer.start()

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Send):
            if message.outputs:
                sending = self._io.submit(self._send_all(message.outputs))
                sending.add_done_callback(self._note_failure)
                self._pending.append(sending)
        elif isinstance(message, Barrier):
            pending, self._pending = self._pending, []
            for future in pending:
                future.result()
        else:
            raise TypeError(f"ProducerActor: unexpected message {message!r}")
        return None

    async def _send_all(self, outputs: Sequence[Output]) -> None:
        """Enqueue a batch's records in order, then wait for their acks.

        ``send`` waits when the producer's buffer is full; without the lock
        the next batch's coroutine would enqueue records meanwhile and
        overtake this one, breaking the order within a partition (DESIGN.md
        invariant 8): a downstream aggregate would then take the overtaken
        events for replays.
        """
        assert self._producer is not None and self._order is not None
        async with self._order:
            acks = []
            for o in outputs:
                acks.append(await self._producer.send(
                    o.topic, o.value, key=o.key, headers=list(o.headers)))
                self._sent += 1
                if self._sent == faults.KILL_AFTER_SENDS:
                    await asyncio.gather(*acks)
                    faults.die()
        await asyncio.gather(*acks)

    def _note_failure(self, sending: concurrent.futures.Future[None]) -> None:
        if not sending.cancelled() and sending.exception() is not None:
            self._failed = True

    def on_stop(self) -> None:
        """Flush if every send so far succeeded; otherwise abort without flushing.

        After a failed delivery, records buffered behind it must never reach
        the broker: they would overtake the failed ones, which the restarted
        pipeline re-sends later, and a downstream aggregate would then take
        the re-sent records for replays.
        """
        if self._producer is not None:
            closing = self._abort() if self._failed else self._producer.stop()
            self._io.run(closing, timeout=self._start_timeout)

    async def _abort(self) -> None:
        assert self._producer is not None
        producer: Any = self._producer
        producer._closed = True  # aiokafka has no public abort: stop its sender unflushed
        await producer._sender.close()
        await producer.client.close()
