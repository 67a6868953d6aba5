"""CommitActor: commits what the checkpoint ledger holds committable, never more.

Thread: the actor's own. At the commit interval (and on demand at rebalance
and shutdown) it asks the ledger for the durable offsets of owned partitions
(none while the producer's outbox holds records: their inputs are behind
them), commits them through the current consumer stream, and tells the
ledger. Committing less often than persisting is safe: replayed records are
discarded by the watermarks.
"""

from __future__ import annotations

import logging
import time

import pykka
from aiokafka.errors import KafkaError

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler, ReportingActor
from onceflow.actors.ledger import SharedLedger
from onceflow.actors.messages import (
    Commit,
    CommitMessage,
    CommitNow,
    CommitTick,
    Mailbox,
    unexpected,
)
from onceflow.stages.state import TopicPartition

log = logging.getLogger(__name__)


class CommitActor(ReportingActor):
    def __init__(self, *, ledger: SharedLedger, on_fatal: FatalHandler):
        super().__init__(on_fatal)
        self._ledger = ledger
        self._consumer: Mailbox | None = None  # a ConsumerActor's

    def use_consumer(self, consumer: Mailbox | None) -> None:
        """The consumer stream to commit through; each new stream sets itself."""
        self._consumer = consumer

    def on_receive(self, message: CommitMessage) -> dict[TopicPartition, int]:
        if isinstance(message, CommitTick | CommitNow):
            return self._commit()
        unexpected("CommitActor", message)

    def _commit(self) -> dict[TopicPartition, int]:
        with self._ledger() as ledger:
            due = ledger.committable()
            held = ledger.outbox_count
        if held:
            log.debug("commit held: %d records in the outbox are not delivered yet", held)
        if not due or self._consumer is None:
            return {}
        started = time.monotonic()
        try:
            owned: dict[TopicPartition, int] = self._consumer.ask(Commit(due))
        except KafkaError as error:  # e.g. a rebalance is under way: retry next tick
            log.warning("commit of %s failed, will retry: %r", due, error)
            return {}
        except pykka.ActorDeadError:  # the stream is being re-created
            return {}
        metrics.COMMIT_SECONDS.observe(time.monotonic() - started)
        with self._ledger() as ledger:
            ledger.committed(owned)
        for (topic, partition), offset in owned.items():
            metrics.COMMITTED.labels(topic, str(partition)).set(offset)
        metrics.committed()
        return owned
