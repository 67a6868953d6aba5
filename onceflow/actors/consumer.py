"""ConsumerActor: the aiokafka consumer, fetching batches into the stage.

Threads: the actor's own thread handles messages (batch done, commit, stop);
the aiokafka consumer lives on the shared ``EventLoopThread`` loop, where
the fetch task and the rebalance callbacks run. Backpressure: at most
``max_in_flight`` batches are with the stage; beyond that the assigned
partitions are paused instead of buffering records. Continuity: with a
``GapCheck``, a fetch that skips offsets is cut before the hole and the
partition re-fetched from it (see ``continuity``), so a broker that answers
before an earlier batch is written cannot make the stream skip it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pykka
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler, ReportingActor
from onceflow.actors.continuity import Continuity
from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import (
    Batch,
    BatchDone,
    Commit,
    CommitNow,
    Flush,
    Forget,
    StopFetching,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionCheck:
    """Alpakka's connection checker: fail a stream whose broker stopped answering."""

    max_retries: int
    interval: float
    backoff_factor: float


@dataclass(frozen=True)
class GapCheck:
    """``onceflow.consumer.gap-*``: re-fetches of a hole before it is accepted, and the pause."""

    refetches: int
    backoff: float


class ConnectionLost(ConnectionError):
    """The broker did not answer ``max_retries + 1`` checks in a row."""


class ConsumerActor(ReportingActor):
    def __init__(
        self,
        *,
        options: Mapping[str, Any],
        topics: Sequence[str],
        max_in_flight: int,
        max_records: int,
        poll_timeout: float,
        start_timeout: float,
        io: EventLoopThread,
        stage: pykka.ActorRef[Any],
        commit: pykka.ActorRef[Any],
        on_fatal: FatalHandler,
        connection_check: ConnectionCheck | None = None,
        on_assigned: Callable[[], Awaitable[int]] | None = None,
        gap_check: GapCheck | None = None,
    ):
        super().__init__(on_fatal)
        self._gap_backoff = gap_check.backoff if gap_check else 0.0
        self._continuity = Continuity(gap_check.refetches) if gap_check else None
        self._held: dict[TopicPartition, asyncio.TimerHandle] = {}  # paused before a re-fetch
        self._on_assigned = on_assigned
        self._check = connection_check
        self._checker: asyncio.Task[None] | None = None
        self._options = dict(options)
        self._max_records = max_records
        self._poll_timeout_ms = int(poll_timeout * 1000)
        self._start_timeout = start_timeout
        self._topics = list(topics)
        self._max_in_flight = max_in_flight
        self._io = io
        self._stage = stage
        self._commit = commit
        self._consumer: AIOKafkaConsumer | None = None
        self._fetch_task: asyncio.Task[None] | None = None
        self._in_flight = 0
        self._room: asyncio.Event | None = None

    def start_up(self) -> None:
        self._io.run(self._open(), timeout=self._start_timeout)

    async def _open(self) -> None:
        self._consumer = AIOKafkaConsumer(**self._options)
        self._consumer.subscribe(self._topics, listener=_Rebalance(self))
        await self._consumer.start()
        self._room = asyncio.Event()
        self._room.set()
        self._fetch_task = asyncio.get_running_loop().create_task(self._fetch_forever())
        self._fetch_task.add_done_callback(self._fetch_ended)
        if self._check is not None:
            self._checker = asyncio.get_running_loop().create_task(self._check_connection())
            self._checker.add_done_callback(self._fetch_ended)
        metrics.STREAM_STARTS.inc()

    async def _check_connection(self) -> None:
        """Ask for metadata every interval; too many silent failures fail the stream."""
        assert self._consumer is not None and self._check is not None
        check, failures, delay = self._check, 0, self._check.interval
        while True:
            await asyncio.sleep(delay)
            try:
                await asyncio.wait_for(self._consumer.topics(), timeout=check.interval)
            except (TimeoutError, KafkaError) as error:
                failures += 1
                log.warning("connection check %d failed: %r", failures, error)
                if failures > check.max_retries:
                    raise ConnectionLost(f"broker silent for {failures} checks") from error
                delay = check.interval * check.backoff_factor ** failures
            else:
                failures, delay = 0, check.interval

    async def _fetch_forever(self) -> None:
        assert self._consumer is not None and self._room is not None
        consumer = self._consumer
        while True:
            if self._in_flight >= self._max_in_flight:
                consumer.pause(*consumer.assignment())
                await self._room.wait()
                consumer.resume(*(consumer.assignment() - set(self._held)))
            batches = await consumer.getmany(
                timeout_ms=self._poll_timeout_ms, max_records=self._max_records
            )
            records: list[Any] = []
            for tp, recs in batches.items():
                if recs:
                    high = consumer.highwater(tp)  # from the fetch, not ListOffsets
                    if high is not None:
                        metrics.LAG.labels(tp.topic, str(tp.partition)).set(
                            high - recs[-1].offset - 1)
                    records += recs if self._continuity is None else self._continuous(tp, recs)
            if records:
                self._in_flight += 1
                if self._in_flight >= self._max_in_flight:
                    self._room.clear()
                try:
                    self._stage.tell(Batch(records, self.actor_ref))
                except pykka.ActorDeadError:
                    log.warning("stage is gone (its failure is being handled): fetch stops")
                    return

    def _continuous(self, tp: TopicPartition, recs: list[Any]) -> list[Any]:
        """The records of ``tp`` before any hole; a hole makes ``tp`` re-fetch from it."""
        assert self._continuity is not None and self._consumer is not None
        verdict = self._continuity.check(tp, recs)
        if verdict.deliver == len(recs) and verdict.accepted is None:
            return recs
        labels = tp.topic, str(tp.partition)
        if verdict.accepted is not None:
            first, last = verdict.accepted
            log.warning("offsets %d..%d of %s[%d] missing after every re-fetch: moving on "
                        "(compacted, a transaction marker, or lost by the broker)",
                        first, last, tp.topic, tp.partition)
            metrics.GAPS_ACCEPTED.labels(*labels).inc()
        if verdict.refetch_from is not None:
            log.info("hole at %s[%d] offset %d: re-fetching",
                      tp.topic, tp.partition, verdict.refetch_from)
            try:
                self._consumer.seek(tp, verdict.refetch_from)  # drops what was prefetched
            except IllegalStateError:  # no longer ours: the next owner starts at the commit
                self._continuity.forget([tp])
            else:
                self._hold(tp)
                metrics.REFETCHES.labels(*labels).inc()
        return recs[:verdict.deliver]

    def _hold(self, tp: TopicPartition) -> None:
        """Pause ``tp`` for the backoff, so the broker has time to write the missing batch."""
        assert self._consumer is not None
        self._consumer.pause(tp)
        if (timer := self._held.pop(tp, None)) is not None:
            timer.cancel()
        self._held[tp] = asyncio.get_running_loop().call_later(
            self._gap_backoff, self._release, tp)

    def _release(self, tp: TopicPartition) -> None:
        self._held.pop(tp, None)
        room = self._room is None or self._room.is_set()  # else the fetch loop resumes it
        if self._consumer is not None and room and tp in self._consumer.assignment():
            self._consumer.resume(tp)

    def _release_all(self) -> None:
        for timer in self._held.values():
            timer.cancel()
        self._held.clear()

    async def learn_positions(self, assigned: set[TopicPartition]) -> None:
        """Learn where each assigned partition starts, so a hole right there is seen too.

        Runs first in the assignment callback: a fresh assignment has no position
        until its committed offset is read, so nothing of it can be consumed yet.
        """
        if self._continuity is None or self._consumer is None:
            return
        consumer, continuity = self._consumer, self._continuity

        async def learn(tp: TopicPartition) -> None:
            try:
                offset = await asyncio.wait_for(consumer.position(tp), self._start_timeout)
            except (TimeoutError, IllegalStateError, KafkaError) as error:
                log.warning("no position for %s[%d] (%r): tracked from its first record",
                            tp.topic, tp.partition, error)
            else:
                continuity.expect(tp, offset)

        await asyncio.gather(*(learn(tp) for tp in assigned))

    def _fetch_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._on_fatal("ConsumerActor.fetch", task.exception() or RuntimeError())

    def _batch_done(self) -> None:
        self._in_flight -= 1
        if self._room is not None and self._in_flight < self._max_in_flight:
            self._room.set()

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, BatchDone):
            self._io.call_soon(self._batch_done)
        elif isinstance(message, Commit):
            return self._io.run(self._commit_assigned(message.offsets))
        elif isinstance(message, StopFetching):
            self._io.run(self._stop_fetching())
        else:
            raise TypeError(f"ConsumerActor: unexpected message {message!r}")
        return None

    async def _commit_assigned(self, offsets: dict[tuple[str, int], int]) -> dict[Any, int]:
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        wanted = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
        owned = {tp: o for tp, o in wanted.items() if tp in assigned}
        if owned:
            await self._consumer.commit(owned)
        return owned

    async def _stop_fetching(self) -> None:
        self._release_all()
        if self._checker is not None:
            self._checker.cancel()
        if self._fetch_task is not None:
            self._fetch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._fetch_task

    def on_stop(self) -> None:
        if self._consumer is not None:
            self._io.run(self._close(), timeout=self._start_timeout)

    async def _close(self) -> None:
        await self._stop_fetching()
        assert self._consumer is not None
        await self._consumer.stop()

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Flush and commit before another member takes the partitions."""
        self._release_all()  # a new assignment starts unpaused
        if self._continuity is not None:
            self._continuity.forget(revoked)
        if not revoked:
            return
        loop = asyncio.get_running_loop()
        lost = frozenset((tp.topic, tp.partition) for tp in revoked)
        try:
            await loop.run_in_executor(None, lambda: self._stage.ask(Flush()))
        except pykka.ActorDeadError:
            log.warning("partitions revoked while the stage is down: nothing more committed")
            return
        await loop.run_in_executor(None, lambda: self._commit.ask(CommitNow()))
        await loop.run_in_executor(None, lambda: self._stage.ask(Forget(lost)))
        await loop.run_in_executor(None, lambda: self._commit.ask(Forget(lost)))
        log.info("partitions revoked, flushed and committed: %s", sorted(lost))


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, actor: ConsumerActor):
        self._actor = actor

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._actor.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("partitions assigned: %s", sorted((tp.topic, tp.partition) for tp in assigned))
        await self._actor.learn_positions(assigned)  # before anything of them is consumed
        if self._actor._on_assigned is not None:  # before anything of them is fetched
            adopted = await self._actor._on_assigned()
            if adopted:
                log.info("adopted %d outbox records, sent before anything new", adopted)
