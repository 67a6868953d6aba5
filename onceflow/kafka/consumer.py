"""ConsumerActor: the aiokafka consumer, fetching batches into the pipeline actor.

Threads: none of its own (a ``LoopActor``): its lifecycle (start, stop fetching,
stop) is called from the supervisor's thread and runs on the loop, where the aiokafka
consumer, the fetch task and the rebalance callbacks live. Start-up does not wait for the
group join (seconds; a stuck broker may hold it for minutes): the join runs on
the loop while the actor can still be told to stop, and ``JoinWatch`` bounds
it. Backpressure: at most ``max_in_flight`` batches are with the pipeline
actor; beyond that the assigned partitions are paused. Continuity: with a
``GapCheck``, a fetch that skips offsets is cut before the hole and the
partition re-fetched from it; always, a partition that serves records below
its assigned position stops the worker (``fetch_continuity``). Starvation: a
partition whose fetches bring no records while its log holds some widens the
fetch's max wait, and at its ceiling fails the stream, which the supervisor
re-creates (``fetch_starvation``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pykka
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition
from aiokafka.errors import IllegalStateError, KafkaError

from onceflow import faults
from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler, LoopActor
from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import (
    Assigned,
    Batch,
    Flush,
    Forget,
    Mailbox,
    PipelineMessage,
)
from onceflow.checkpoint.log_marks import LogCheck, LogMark, mark_of
from onceflow.kafka.connection_check import ConnectionCheck, check_connection
from onceflow.kafka.continuity import GapCheck
from onceflow.kafka.fetch_continuity import FetchContinuity
from onceflow.kafka.fetch_starvation import FetchStarvation
from onceflow.kafka.join_watch import JoinWatch, enforce
from onceflow.kafka.kafka_parts import close_parts, ours
from onceflow.kafka.rebalance import RebalanceListener, warn_partial_assignment
from onceflow.kafka.tail_reader import ExclusiveResume
from onceflow.stages.state import TopicPartition
from onceflow.stores.fencing.held_epochs import Fencing

if TYPE_CHECKING:
    from onceflow.checkpoint.coordinator import Checkpoints
    from onceflow.kafka.producer import ProducerActor

log = logging.getLogger(__name__)

class ConsumerActor(LoopActor):
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
        pipeline: Mailbox[PipelineMessage],
        checkpoints: Checkpoints,
        producer: ProducerActor,
        on_fatal: FatalHandler,
        gap_check: GapCheck,
        connection_check: ConnectionCheck | None = None,
        join_watch: JoinWatch | None = None,
        stop_timeout: float | None = None,
        single_worker: bool = False,
        exclusive: ExclusiveResume | None = None,
        fencing: Fencing | None = None,
        log_check: LogCheck | None = None,
    ):
        super().__init__(on_fatal)
        self._log_check = log_check  # on assignment, before anything else
        self.generations: dict[TopicPartition, int] = {}  # of forgotten root logs: log_check's
        self._fencing, self._exclusive = fencing, exclusive  # both act on assignment
        self._single_worker = single_worker
        self._settling: set[KafkaPartition] = set()  # assigned, paused until adoption is done
        self._gaps = FetchContinuity(gap_check, self._may_resume)
        self._continuity = self._gaps.continuity
        self._starvation = FetchStarvation(options, self._continuity)
        self._join = join_watch
        self._stop_timeout = start_timeout if stop_timeout is None else stop_timeout
        self._opening: asyncio.Task[None] | None = None
        self._join_enforcer: asyncio.Task[None] | None = None
        self._producer = producer
        self._check = connection_check
        self._checker: asyncio.Task[None] | None = None
        self._options = dict(options)
        self._max_records = max_records
        self._poll_timeout_ms = int(poll_timeout * 1000)
        self._start_timeout = start_timeout
        self._topics = list(topics)
        self._max_in_flight = max_in_flight
        self._io = io
        self._pipeline = pipeline
        self._checkpoints = checkpoints
        self._consumer: AIOKafkaConsumer | None = None
        self._fetch_task: asyncio.Task[None] | None = None
        self._stopping = False  # the fetch loop's own stop: a cancel can be swallowed
        self._in_flight = 0
        self._room: asyncio.Event | None = None

    def start(self) -> None:
        """Create the stream (from the supervisor's thread; the join goes on on the loop)."""
        self._io.run(self._begin(), timeout=self._start_timeout)

    async def _begin(self) -> None:
        """Create the stream and let it join in the background (see the module doc)."""
        self._consumer = AIOKafkaConsumer(**self._options)
        self._consumer.subscribe(self._topics, listener=RebalanceListener(
            self, self._exclusive, self._fencing))
        self._checkpoints.use_consumer(self.commit_assigned)  # commits go through this stream
        metrics.STREAM_STARTS.inc()
        self.join_began()
        self._opening = self._background(self._open())
        if self._join is not None:
            self._join_enforcer = self._background(enforce(self._join))
        if self._check is not None:  # a broker that goes silent during the join too
            self._checker = self._background(check_connection(self._consumer, self._check))

    def _background(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task of this stream whose failure fails the stream."""
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(self._fetch_ended)
        return task

    async def _open(self) -> None:
        assert self._consumer is not None
        await self._consumer.start()  # returns once the first join assigned partitions
        self._room = asyncio.Event()
        self._room.set()
        self._fetch_task = self._background(self._fetch_forever())

    async def _fetch_forever(self) -> None:
        assert self._consumer is not None and self._room is not None
        consumer = self._consumer
        while not self._stopping:
            if self._in_flight >= self._max_in_flight:
                consumer.pause(*consumer.assignment())
                await self._room.wait()
                if self._stopping:
                    return
                self._starvation.idle()  # nothing was fetched while paused
                consumer.resume(*(consumer.assignment() - self._gaps.held - self._settling))
            batches = await consumer.getmany(
                timeout_ms=max(self._poll_timeout_ms, self._starvation.poll_floor_ms),
                max_records=self._max_records
            )
            records: list[Any] = []
            marks: dict[TopicPartition, LogMark] = {}
            for tp, recs in batches.items():
                if recs:
                    high = consumer.highwater(tp)  # from the fetch, not ListOffsets
                    if high is not None:
                        metrics.LAG.labels(tp.topic, str(tp.partition)).set(
                            high - recs[-1].offset - 1)
                    delivered = self._gaps.deliverable(consumer, tp, recs)
                    if delivered:
                        marks[ours(tp)] = mark_of(delivered[-1])  # one per partition
                        records += delivered
            self._gaps.check_ends(consumer)
            await self._starvation.after_fetch(consumer, batches)
            if records and not self._stopping:
                self._in_flight += 1
                if self._in_flight >= self._max_in_flight:
                    self._room.clear()
                try:
                    self._pipeline.tell(Batch(records, self._batch_done, marks))
                except pykka.ActorDeadError:
                    log.warning("pipeline actor gone (its failure is being handled): fetch stops")
                    return
                if faults.FETCH_FAILS_AFTER and faults.fetch_fails():
                    raise faults.InjectedFailure("injected fetch failure")

    def fetch_state(self) -> dict[str, Any]:
        """(any thread: racy reads, for reports) What holds the fetch loop back: batches
        with the pipeline (at the bound it pauses everything), partitions paused."""
        def names(tps: Iterable[KafkaPartition]) -> list[str]:
            return sorted(f"{tp.topic}[{tp.partition}]" for tp in tps)

        try:
            paused = [] if self._consumer is None else names(self._consumer.paused())
            held, settling = names(self._gaps.held), names(set(self._settling))
        except RuntimeError:  # a set changed on the loop while read: no report this time
            return {}
        return {"in_flight": self._in_flight, "max_in_flight": self._max_in_flight,
                "paused": paused, "refetching": held, "settling": settling}

    def _may_resume(self, tp: KafkaPartition) -> bool:
        """Whether a partition whose re-fetch pause ends may be fetched again."""
        room = self._room is None or self._room.is_set()  # else the fetch loop resumes it
        return room and tp not in self._settling

    def settle(self, assigned: set[KafkaPartition]) -> None:
        """Pause newly assigned partitions until their outbox rows are adopted.

        Called first thing in the assignment callback, before any await: their
        committed offsets are being read meanwhile, and a record of theirs
        processed before the adoption would send outputs ahead of the adopted
        rows, which downstream would then discard as replays.
        """
        assert self._consumer is not None
        self._settling = set(assigned)
        self._consumer.pause(*assigned)

    def settled(self) -> None:
        """Resume what ``settle`` paused (unless backpressure or a re-fetch holds it)."""
        assert self._consumer is not None
        settled, self._settling = self._settling, set()
        if self._room is None or self._room.is_set():  # else the fetch loop resumes them
            self._consumer.resume(*(settled & self._consumer.assignment() - self._gaps.held))

    async def check_logs(self, assigned: set[KafkaPartition]) -> bool:
        """Whether every assigned partition still holds the record its states were folded
        up to (``log_marks``); False after reporting the failure (aiokafka would only log
        an exception from the assignment callback)."""
        if self._log_check is None:
            return True
        try:
            verified = await self._log_check.verify(assigned)
        except Exception as error:
            log.error("%s", error)
            self._on_fatal("ConsumerActor.log_check", error)
            return False
        self.generations = verified.generations
        self._checkpoints.logs.assigned(self._log_check, map(ours, assigned), verified.marks)
        return True

    def check_single_worker(self, assigned: set[KafkaPartition]) -> None:
        if self._single_worker and self._consumer is not None:
            warn_partial_assignment(self._consumer, self._topics, assigned)

    async def learn_positions(self, assigned: set[KafkaPartition]) -> dict[TopicPartition, int]:
        """Where each assigned partition resumes (-1 if unknown).

        Runs first in the assignment callback: a fresh assignment has no position
        until its committed offset is read, so nothing of it can be consumed yet.
        Continuity learns them too, so a hole right at the start is seen.
        """
        assert self._consumer is not None
        consumer, continuity = self._consumer, self._continuity
        positions: dict[TopicPartition, int] = {}

        async def learn(tp: KafkaPartition) -> None:
            try:
                offset = await asyncio.wait_for(consumer.position(tp), self._start_timeout)
            except (TimeoutError, IllegalStateError, KafkaError) as error:
                log.warning("no position for %s[%d] (%r): its cached states are dropped, "
                            "and continuity tracks it from its first record",
                            tp.topic, tp.partition, error)
                positions[ours(tp)] = -1
            else:
                positions[ours(tp)] = offset
                continuity.expect(ours(tp), offset)

        await asyncio.gather(*(learn(tp) for tp in assigned))
        return positions

    async def resume(self, positions: dict[TopicPartition, int],
                     moved: set[TopicPartition]) -> None:
        """Tell the ledger the assignment; forget cached progress it finds stale.

        A stream re-created after an outage usually gets its partitions back
        at the offsets this worker committed: the cached states are still right.
        A partition resumed from elsewhere (another member committed it), ``moved``
        (held by another, its epoch says) or gone makes the pipeline actor drop them.
        """
        stale = self._checkpoints.assigned(positions, moved)
        if stale:
            log.info("partitions %s moved while this stream was away: states reload",
                     sorted(stale))
            lost = frozenset(stale)
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: self._pipeline.ask(Forget(lost)))
        self._pipeline.tell(Assigned(frozenset(positions), positions,  # before any record
                                     dict(self.generations)))

    async def adopt(self) -> None:
        """Queue the outbox rows of lanes that left other workers, before anything new."""
        adopted = await self._producer.adopt()
        if adopted:
            log.info("adopted %d outbox records, sent before anything new", adopted)

    def _fetch_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._on_fatal("ConsumerActor.fetch", task.exception() or RuntimeError())

    def _batch_done(self) -> None:
        self._in_flight -= 1
        if self._room is not None and self._in_flight < self._max_in_flight:
            self._room.set()

    def stop_fetching(self, timeout: float) -> None:
        """Answers once no more batches will be sent (a graceful stop)."""
        self._io.run(self._stop_fetching(), timeout=timeout)

    async def commit_assigned(self, offsets: dict[TopicPartition, int]
                              ) -> dict[TopicPartition, int]:
        """(on the loop, from ``Checkpoints.commit``) Commit the offsets of the partitions
        still assigned; answers those."""
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        wanted = {KafkaPartition(t, p): o for (t, p), o in offsets.items()}
        owned = {tp: o for tp, o in wanted.items() if tp in assigned}
        if owned:
            await self._consumer.commit(owned)
        return {ours(tp): o for tp, o in owned.items()}

    async def _stop_fetching(self) -> None:
        """Stop the fetch loop for good. Cancelling it is not enough: a cancel that meets
        an inner wait finishing at the same moment is swallowed (``asyncio.wait_for`` in
        Python 3.11 returns the result instead), and the loop then waited for room that
        only a batch done queued behind this very call could make: the stop hung
        until the exit deadline. The flag and the room's event end it whatever the
        cancel did."""
        self._stopping = True
        self._gaps.release_all()
        for task in (self._opening, self._join_enforcer, self._checker):
            if task is not None:
                task.cancel()
        if self._fetch_task is not None:
            self._fetch_task.cancel()
            if self._room is not None:
                self._room.set()
            try:
                await self._fetch_task
            except asyncio.CancelledError:
                pass
            except Exception as error:  # why this stream stops: reported when it ended
                log.debug("the fetch loop had failed: %r", error)

    def stop(self) -> None:
        """Stop fetching and leave the group (bounded); from the supervisor's thread."""
        if self._consumer is not None:
            self._io.run(self._close(), timeout=self._stop_timeout + 1)

    async def _close(self) -> None:
        """Leave the group whatever else fails: a consumer left open stays a member (its
        heartbeats run on the shared loop) and holds its partitions unfetched, beside the
        stream that replaces it, until ``max_poll_interval_ms`` (5 min) evicts it."""
        self._checkpoints.detach(self.commit_assigned)
        try:
            await self._stop_fetching()
        finally:
            try:
                await self._leave()
            finally:
                if self._log_check is not None:  # its probe: no broker round trip to close
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._log_check.close(), self._stop_timeout)

    async def _leave(self) -> None:
        assert self._consumer is not None
        try:  # leaving waits for a join under way to finish: bounded
            await asyncio.wait_for(self._consumer.stop(), self._stop_timeout)
        except TimeoutError:
            log.warning("consumer did not leave its group within %.1fs (a join was under "
                        "way); the broker drops it after the session timeout",
                        self._stop_timeout)
            await close_parts(self._consumer)

    def join_began(self) -> None:
        if self._join is not None:
            self._join.joining()

    def join_ended(self) -> None:
        if self._join is not None:
            self._join.joined()

    async def on_revoked(self, revoked: set[KafkaPartition]) -> None:
        """Flush and commit before another member takes the partitions."""
        self._gaps.release_all()  # a new assignment starts unpaused
        lost = frozenset(ours(tp) for tp in revoked)
        self._continuity.forget(lost)
        self._starvation.forget(revoked)
        if not lost:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, lambda: self._pipeline.ask(Flush()))
        except pykka.ActorDeadError:
            log.warning("partitions revoked while the pipeline actor is down: "
                        "nothing more committed")
            return
        await self._checkpoints.commit()
        await loop.run_in_executor(None, lambda: self._pipeline.ask(Forget(lost)))
        log.info("partitions revoked, flushed and committed: %s", sorted(lost))
