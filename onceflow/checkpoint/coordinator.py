"""The checkpoint coordinator: the ledger's numbered steps, from one thread (the loop).

The pure ``Ledger`` (docs/architecture.md, section 5) is touched only here,
and only on the event loop, where the sends settle, the outbox count changes,
the assignments arrive and the commits go out: no lock. The other threads
hand it what happened in one call each:

- the pipeline thread, per batch (``hand_over``): the batch's next offsets
  (``processed``), its outputs (sent from the loop, in order, once a check of
  their input logs begun after the hand-over passed: ``log_watch``) and the
  consumer's batch done, plus, when one is due, the snapshot encoded right
  after that batch (``take``: it covers exactly the batches handed over
  before it, as the calls arrive in order);
- persistence (a single thread of its own for the blocking store writes) is
  handed each checkpoint once its sends are settled (``settled``) and the
  ledger says ``writable``; its write resolves on the loop (``written``);
- a loop timer commits (``committable``, the consumer's commit,
  ``committed``), and a revoke awaits the same commit.

Before each write too, the input logs it advanced are checked to still hold
the records already folded (``log_watch``: a topic re-created under the worker).
Snapshots are written one at a time, in the order taken. A failed send or
write fails the snapshot's answer and reports the core failed: nothing after
it becomes durable, and the supervisor restarts from what is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka.errors import KafkaError

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler
from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import Snapshot, StageRows
from onceflow.checkpoint.ledger import Ledger, LedgerError
from onceflow.checkpoint.log_marks import LogMark
from onceflow.checkpoint.log_watch import LogWatch
from onceflow.stages.outcome import Output
from onceflow.stages.state import TopicPartition

log = logging.getLogger(__name__)

#: A consumer stream's commit: commits the offsets of the partitions still assigned,
#: answers what it committed (``ConsumerActor.commit_assigned``, on the loop).
CommitFn = Callable[[dict[TopicPartition, int]], Awaitable[dict[TopicPartition, int]]]
#: Starts a batch's outputs on their lanes (on the loop), with the batch's input partitions
#: (its outputs may be produced only while they are held); resolves once all are settled.
SendFn = Callable[[Sequence[Output], frozenset[TopicPartition]], Awaitable[None]]


class Writer(Protocol):
    """What the coordinator needs of persistence (``persistence.StoreWriter``): blocking
    calls, run on persistence's own thread."""

    def write(self, snapshot: Snapshot) -> object: ...
    def add_stats(self, stats: Mapping[str, int]) -> None: ...


@dataclass
class Taking:
    """A snapshot encoded by the pipeline thread, before the ledger numbered it; ``answer``
    resolves with the durable offsets once written (None when there was nothing new)."""

    rows: Sequence[StageRows]
    stats: dict[str, int]
    force: bool
    answer: concurrent.futures.Future[Mapping[TopicPartition, int] | None] = field(
        default_factory=concurrent.futures.Future)


class Checkpoints:
    """Owns the ledger; runs take, settle, write, written and commit on the loop."""

    def __init__(self, io: EventLoopThread, on_fatal: FatalHandler,
                 writer: Writer | None = None, ledger: Ledger | None = None):
        self.ledger = ledger or Ledger()  # touch only on the loop
        self._io = io
        self._on_fatal = on_fatal
        self._writer = writer
        self.logs = LogWatch()  # each write's input logs checked first (touch on the loop)
        self._persistence = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="onceflow-persistence")
        self._send: SendFn | None = None
        self._sending: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._turn: asyncio.Future[None] | None = None  # the last send handed over
        self._last_write: asyncio.Future[bool] | None = None
        self._answers: set[concurrent.futures.Future[Mapping[TopicPartition, int] | None]] = set()
        self._consumer: CommitFn | None = None
        self._lock = asyncio.Lock()  # bound to the io loop at first use
        self._ticking: asyncio.Task[dict[TopicPartition, int]] | None = None
        #: The partitions of the current assignment, for /health (read from any thread).
        self.owned: frozenset[TopicPartition] = frozenset()
        # Every offset committed so far, a new dict per commit (read by other threads:
        # a join's table drops the row versions no replay can need any more).
        self.last_committed: dict[TopicPartition, int] = {}

    def use_producer(self, send: SendFn) -> None:
        self._send = send

    # -- from other threads ----------------------------------------------

    def hand_over(self, next_offsets: Mapping[TopicPartition, int],
                  marks: Mapping[TopicPartition, LogMark] | None,
                  outputs: Sequence[Output], done: Callable[[], None] | None,
                  taking: Taking | None) -> None:
        """(the pipeline thread) One batch, in one hand-off to the loop."""
        self._io.call_soon(self._batch, next_offsets, marks, outputs, done, taking)

    def take(self, taking: Taking) -> None:
        """(the pipeline thread) A snapshot with no batch to ride with (a tick, a flush)."""
        self._io.call_soon(self._batch, {}, None, (), None, taking)

    def run(self, step: Callable[[Ledger], object], timeout: float | None = None) -> object:
        """(any thread but the loop) One ledger step on the loop, its answer (a revoke's
        ``unwritten`` and ``forget``: rare, and the loop is free meanwhile)."""
        async def on_loop() -> object:
            answer = step(self.ledger)
            self.owned = self.ledger.owned()
            return answer
        return self._io.run(on_loop(), timeout=timeout)

    def commit_now(self, timeout: float) -> dict[TopicPartition, int]:
        """``commit`` from another thread (a graceful or supervised stop); never from the
        loop."""
        return self._io.run(self.commit(), timeout=timeout)

    def stop(self) -> None:
        """After the loop stopped: persistence's thread ends after the write under way (none
        is started again), and whoever still waits for a snapshot is told it failed."""
        self._persistence.shutdown(wait=False, cancel_futures=True)
        for answer in list(self._answers):
            if not answer.done():
                answer.set_exception(LedgerError("the core stopped before the snapshot "
                                                 "was written"))

    # -- on the loop -------------------------------------------------------

    def _batch(self, next_offsets: Mapping[TopicPartition, int],
               marks: Mapping[TopicPartition, LogMark] | None, outputs: Sequence[Output],
               done: Callable[[], None] | None, taking: Taking | None) -> None:
        try:
            self._step(next_offsets, marks, outputs, done, taking)
        except Exception as error:  # a loop callback's failure would only be logged
            if taking is not None and not taking.answer.done():
                taking.answer.set_exception(error)
            self._on_fatal("Checkpoints.hand_over", error)

    def _step(self, next_offsets: Mapping[TopicPartition, int],
              marks: Mapping[TopicPartition, LogMark] | None, outputs: Sequence[Output],
              done: Callable[[], None] | None, taking: Taking | None) -> None:
        number = self.ledger.processed(next_offsets, sent=bool(outputs), marks=marks)
        if marks:
            self.logs.seen(marks)
        if done is not None:
            done()
        if outputs:
            before, self._turn = self._turn, asyncio.get_running_loop().create_future()
            self._sending.append((number, asyncio.ensure_future(self._checked_send(
                frozenset(next_offsets), outputs, before, self._turn))))
        if taking is not None:
            self._take(taking)

    async def _checked_send(self, partitions: frozenset[TopicPartition],
                            outputs: Sequence[Output], before: asyncio.Future[None] | None,
                            turn: asyncio.Future[None]) -> None:
        """Send once a check begun now found the inputs' logs unchanged (``log_watch``:
        a re-created topic's records never reach an output), and once the batch before
        started its send (``turn``: batches start in the order handed over)."""
        assert self._send is not None
        try:
            await self.logs.checked(partitions)  # a tick's outputs (none named): every log
            if before is not None:
                await before
        finally:
            turn.set_result(None)  # failed or not: the next one's check decides for it
        await self._send(outputs, partitions)

    def _take(self, taking: Taking) -> None:
        checkpoint = self.ledger.take(dirty=bool(taking.rows), force=taking.force)
        if checkpoint is None:
            taking.answer.set_result(None)
            return
        sends = []
        while self._sending and self._sending[0][0] <= checkpoint.sends:
            sends.append(self._sending.popleft()[1])
        snapshot = Snapshot(taking.rows, checkpoint, taking.stats)
        self._answers.add(taking.answer)
        taking.answer.add_done_callback(self._answers.discard)
        self._last_write = asyncio.ensure_future(
            self._write(snapshot, sends, self._last_write, taking.answer))

    async def _write(self, snapshot: Snapshot, sends: list[asyncio.Future[None]],
                     before: asyncio.Future[bool] | None,
                     answer: concurrent.futures.Future[Mapping[TopicPartition, int] | None]
                     ) -> bool:
        """Settle, write, written, after the snapshot before it; False when it failed."""
        checkpoint = snapshot.checkpoint
        try:
            if before is not None and not await before:
                # written in order, or not at all
                raise LedgerError(f"checkpoint {checkpoint.number} not written: an earlier "
                                  "one failed")
            # Records produced from these inputs first (invariant 5): an aggregate that
            # forwards to a republish step discards replays once its state is written.
            await _all(sends)
            self.ledger.settled(checkpoint.sends)
            if not self.ledger.writable(checkpoint):
                raise LedgerError(f"checkpoint {checkpoint.number} may not be written: "
                                  f"{self.ledger.why_not_writable(checkpoint)}")
            assert self._writer is not None
            await self.logs.verify(checkpoint.marks)  # folded from the logs it names
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._persistence, self._writer.write, snapshot)
            self.ledger.written(checkpoint)
            self.logs.written(checkpoint.marks)
            if snapshot.stats:
                await loop.run_in_executor(self._persistence, self._writer.add_stats,
                                           snapshot.stats)
        except Exception as error:
            if not answer.done():
                answer.set_exception(error)
            self._on_fatal("Checkpoints.write", error)
            return False
        if not answer.done():
            answer.set_result(checkpoint.offsets)
        return True

    def assigned(self, positions: Mapping[TopicPartition, int],
                 moved: Iterable[TopicPartition]) -> set[TopicPartition]:
        """(on the loop) The new assignment; answers the stale partitions."""
        stale = self.ledger.assigned(positions, moved)
        self.owned = self.ledger.owned()
        return stale

    def outboxed(self, delta: int) -> None:
        """(on the loop, ``delivery.OutboxTally``) Records entered or left the outbox."""
        self.ledger.outboxed(delta)

    def use_consumer(self, commit: CommitFn | None) -> None:
        """(on the loop) The consumer stream to commit through; each new stream sets itself,
        and a stopped one unsets it: nothing is committed while there is none."""
        self._consumer = commit

    def detach(self, commit: CommitFn) -> None:
        """(on the loop) A stream that stops: nothing more goes through it."""
        if self._consumer == commit:
            self._consumer = None

    def tick(self) -> None:
        """(loop timer) Start a commit unless one is still under way (a slow broker must
        not pile commits up)."""
        if self._ticking is None or self._ticking.done():
            self._ticking = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> dict[TopicPartition, int]:
        try:
            return await self.commit()
        except Exception as error:  # not a Kafka refusal: the core restarts
            self._on_fatal("Checkpoints.commit", error)
            return {}

    async def commit(self) -> dict[TopicPartition, int]:
        """(on the loop) Commit the durable offsets of owned partitions; answers what was
        committed. A ``KafkaError`` (e.g. a rebalance under way) commits nothing: the
        next tick tries again. Commits never overlap, so ``committable`` and
        ``committed`` stay one decision."""
        async with self._lock:
            due = self.ledger.committable()
            held = self.ledger.outbox_count
            if held:
                log.debug("commit held: %d records in the outbox are not delivered yet", held)
            commit = self._consumer
            if not due or commit is None:
                return {}
            started = time.monotonic()
            try:
                owned = await commit(due)
            except KafkaError as error:
                log.warning("commit of %s failed, will retry: %r", due, error)
                return {}
            metrics.COMMIT_SECONDS.observe(time.monotonic() - started)
            self.ledger.committed(owned)
            self.last_committed = {**self.last_committed, **owned}
        for (topic, partition), offset in owned.items():
            metrics.COMMITTED.labels(topic, str(partition)).set(offset)
        metrics.committed()
        return owned


async def _all(sends: list[asyncio.Future[None]]) -> None:
    """Every send settled; the first failure raises (the others' are retrieved)."""
    try:
        await asyncio.gather(*sends)
    except BaseException:
        for send in sends:
            if send.done() and not send.cancelled():
                send.exception()
        raise
