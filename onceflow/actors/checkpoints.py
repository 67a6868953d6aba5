"""The checkpoint coordinator: the ledger's numbered steps, run on the event loop.

The loop is where the Kafka clients live, so the steps that touch them run
here without a thread in between: a commit (the ledger's ``committable``, the
current consumer's commit, ``committed``) is a coroutine on the loop, started
by a loop timer every ``onceflow.commit.interval`` and awaited directly by a
revoke; a graceful stop runs it from its own thread (``commit_now``). Commits
never overlap (one lock), so ``committable`` and ``committed`` stay one decision
(docs/architecture.md, invariant 5 and section 5).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka.errors import KafkaError

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler
from onceflow.actors.ledger import SharedLedger
from onceflow.actors.loop import EventLoopThread
from onceflow.stages.state import TopicPartition

log = logging.getLogger(__name__)

#: A consumer stream's commit: commits the offsets of the partitions still assigned,
#: answers what it committed (``ConsumerActor.commit_assigned``, on the loop).
CommitFn = Callable[[dict[TopicPartition, int]], Awaitable[dict[TopicPartition, int]]]


class Checkpoints:
    """Commits what the ledger holds committable, never more, on the loop."""

    def __init__(self, ledger: SharedLedger, io: EventLoopThread, on_fatal: FatalHandler):
        self._ledger = ledger
        self._io = io
        self._on_fatal = on_fatal
        self._consumer: CommitFn | None = None
        self._lock = asyncio.Lock()  # bound to the loop at first use, which is the io loop
        self._ticking: asyncio.Task[dict[TopicPartition, int]] | None = None

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
        next tick tries again."""
        async with self._lock:
            with self._ledger() as ledger:
                due = ledger.committable()
                held = ledger.outbox_count
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
            with self._ledger() as ledger:
                ledger.committed(owned)
        for (topic, partition), offset in owned.items():
            metrics.COMMITTED.labels(topic, str(partition)).set(offset)
        metrics.committed()
        return owned

    def commit_now(self, timeout: float) -> dict[TopicPartition, int]:
        """``commit`` from another thread (a graceful or supervised stop); never from the
        loop."""
        return self._io.run(self.commit(), timeout=timeout)
