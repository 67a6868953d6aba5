"""CommitActor: commits each partition's durable offset, never past it.

Thread: the actor's own. It only ever learns offsets from the persistence
actor after their effects are durable, keeps the newest per partition, and
commits them through the consumer at the commit interval (and on demand at
rebalance and shutdown). Committing less often than persisting is safe:
replayed records are discarded by the watermarks. While the producer's
outbox holds undelivered records nothing is committed: their inputs are
behind them (``onceflow.actors.delivery``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pykka
from aiokafka.errors import KafkaError

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler, ReportingActor
from onceflow.actors.messages import Commit, CommitNow, CommitTick, Durable, Forget
from onceflow.stages.state import TopicPartition

log = logging.getLogger(__name__)


class CommitActor(ReportingActor):
    def __init__(self, *, on_fatal: FatalHandler, outboxed: Callable[[], int] = lambda: 0):
        super().__init__(on_fatal)
        self._outboxed = outboxed
        self._consumer: pykka.ActorRef[Any] | None = None
        self._durable: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}

    def use_consumer(self, consumer: pykka.ActorRef[Any]) -> None:
        """Set once at start: the consumer is started after this actor."""
        self._consumer = consumer

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Durable):
            for tp, offset in message.offsets.items():
                if offset > self._durable.get(tp, -1):
                    self._durable[tp] = offset
        elif isinstance(message, CommitTick | CommitNow):
            return self._commit()
        elif isinstance(message, Forget):
            for tp in message.partitions:
                self._durable.pop(tp, None)
                self._committed.pop(tp, None)
        else:
            raise TypeError(f"CommitActor: unexpected message {message!r}")
        return None

    def _commit(self) -> dict[TopicPartition, int]:
        due = {tp: o for tp, o in self._durable.items() if self._committed.get(tp) != o}
        if not due or self._consumer is None:
            return {}
        held = self._outboxed()
        if held:
            log.info("commit held: %d records in the outbox are not delivered yet", held)
            return {}
        try:
            self._consumer.ask(Commit(due))
        except KafkaError as error:  # e.g. a rebalance is under way: retry next tick
            log.warning("commit of %s failed, will retry: %r", due, error)
            return {}
        self._committed.update(due)
        for (topic, partition), offset in due.items():
            metrics.COMMITTED.labels(topic, str(partition)).set(offset)
        metrics.progressed()
        return due
