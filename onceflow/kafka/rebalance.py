"""The consumer's rebalance listener: what happens, in order, when partitions move.

Revoke: flush and commit before another member takes them (the actor's
``on_revoked``), then count the time to the next assignment as join time.
Assign: pause the new partitions first (before any await), check that each
still holds the record its states were folded up to (``log_marks``), learn where
each resumes, take a new epoch for them in the store (fencing: from then on a
worker that held them before can no longer write for them), tell the
checkpoint ledger (which finds stale cached progress), adopt the outbox, read
what exclusive republish steps already wrote (``onceflow.kafka.tail_reader``),
and only then let them be fetched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaPartition

from onceflow.kafka.tail_reader import ExclusiveResume
from onceflow.stages.state import TopicPartition
from onceflow.stores.fencing.held_epochs import Fencing

log = logging.getLogger(__name__)


class Rebalancing(Protocol):
    """What the listener needs of ``ConsumerActor``."""

    async def on_revoked(self, revoked: set[KafkaPartition]) -> None: ...
    def join_began(self) -> None: ...
    def join_ended(self) -> None: ...
    def settle(self, assigned: set[KafkaPartition]) -> None: ...
    def settled(self) -> None: ...
    def check_single_worker(self, assigned: set[KafkaPartition]) -> None: ...
    async def check_logs(self, assigned: set[KafkaPartition]) -> bool: ...
    @property
    def generations(self) -> dict[TopicPartition, int]: ...  # of forgotten root logs
    async def learn_positions(self, assigned: set[KafkaPartition]
                              ) -> dict[TopicPartition, int]: ...
    async def resume(self, positions: dict[TopicPartition, int],
                     moved: set[TopicPartition]) -> None: ...
    async def adopt(self) -> None: ...


class RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, actor: Rebalancing, exclusive: ExclusiveResume | None = None,
                 fencing: Fencing | None = None):
        self._actor = actor
        self._exclusive = exclusive
        self._fencing = fencing  # epochs (docs/architecture.md, "Fencing")

    async def on_partitions_revoked(self, revoked: set[KafkaPartition]) -> None:
        try:
            await self._actor.on_revoked(revoked)
            if self._fencing is not None:  # flushed and forgotten: guards no longer name them
                self._fencing.fence.drop(_ours(revoked))
        finally:  # aiokafka sends JoinGroup next; the flush above is not join time
            self._actor.join_began()

    async def _take_epochs(self, assigned: set[KafkaPartition]) -> set[TopicPartition]:
        """The next epoch of each assigned partition; answers those that moved (another
        worker held them since this one last did). Without fencing, none."""
        fencing = self._fencing
        if fencing is None:
            return set()
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: fencing.take(_ours(assigned)))

    async def on_partitions_assigned(self, assigned: set[KafkaPartition]) -> None:
        self._actor.settle(assigned)  # nothing of them reaches the pipeline until settled()
        try:
            self._actor.join_ended()
            log.info("partitions assigned: %s",
                     sorted((tp.topic, tp.partition) for tp in assigned))
            self._actor.check_single_worker(assigned)
            if not await self._actor.check_logs(assigned):
                return  # failed, reported: the partitions stay paused, nothing is committed
            positions = await self._actor.learn_positions(assigned)
            moved = await self._take_epochs(assigned)
            await self._actor.resume(positions, moved)
            if self._fencing is not None:  # their old progress is forgotten: writable again
                self._fencing.fence.release(moved)
            await self._actor.adopt()
        except BaseException:
            self._actor.settled()
            raise
        # After the adoption: outbox rows count as written. If this fails, the stream
        # is failed and the partitions stay paused (replayed without it, outputs double).
        if self._exclusive is None or await self._exclusive.resume(
                positions, self._actor.generations):
            self._actor.settled()


def _ours(partitions: set[KafkaPartition]) -> set[TopicPartition]:
    return {(tp.topic, tp.partition) for tp in partitions}


def warn_partial_assignment(consumer: AIOKafkaConsumer, topics: Sequence[str],
                            assigned: set[KafkaPartition]) -> None:
    """With ``single-worker``, warn when the group gave this worker only some partitions."""
    every = {(topic, p) for topic in topics for p in consumer.partitions_for_topic(topic) or ()}
    missing = every - {(tp.topic, tp.partition) for tp in assigned}
    if missing:
        log.warning("onceflow.single-worker is set, but this worker was assigned %d of %d "
                    "partitions (not %s): another member is in the group; while it is "
                    "alive, keys fed from several partitions lose events", len(assigned),
                    len(every), sorted(missing)[:5])
