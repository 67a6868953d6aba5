"""The consumer's side of offset continuity: holes re-fetched, rewound logs noticed.

``Continuity`` (pure) judges each fetch; this acts on its verdicts with the
aiokafka consumer, kept out of ``ConsumerActor`` so the actor reads as the
fetch loop it is. A fetch that skips offsets is cut before the hole, the
partition ``seek``s back to it and stays paused for ``gap-refetch-backoff``
(the broker gets time to write the missing batch); a hole still there after
``gap-refetches`` tries is accepted (logged, counted). A hole the fetch explains
(offsets served in batches aiokafka skips on purpose: transaction markers, aborted
transactions; ``skipped_batches``) is passed without either. Once a second the
fetched high watermarks are compared with where this worker is, so a log
that restarted below it is caught even when the broker serves nothing there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition
from aiokafka.errors import IllegalStateError

from onceflow.actors import metrics
from onceflow.kafka.continuity import Continuity, Explained, GapCheck
from onceflow.kafka.kafka_parts import ours
from onceflow.kafka.skipped_batches import skipped

log = logging.getLogger(__name__)


def explained_by(consumer: AIOKafkaConsumer, tp: KafkaPartition) -> Explained:
    """Whether ``consumer``'s fetches of ``tp`` served a hole in batches aiokafka skips on
    purpose (asked about holes only; ranges below the hole are dropped then)."""

    def explained(first: int, last: int) -> bool:
        ranges = skipped(consumer, tp)
        if ranges is None:
            return False
        ranges.forget_below(first)  # the continuity check is past them
        return ranges.covers(first, last)

    return explained


class FetchContinuity:
    """Holes and rewinds of one consumer stream's partitions.

    ``may_resume(tp)``: whether the stream lets ``tp`` be fetched again once its
    re-fetch pause ends (not while backpressure or an adoption holds it).
    """

    def __init__(self, gap_check: GapCheck, may_resume: Callable[[KafkaPartition], bool]
                 ) -> None:
        self.continuity = Continuity(gap_check.refetches, gap_check.rewind_grace)
        self._backoff = gap_check.backoff
        self._may_resume = may_resume
        self._held: dict[KafkaPartition, asyncio.TimerHandle] = {}  # paused before a re-fetch
        self._ends_checked = 0.0  # when the fetched high watermarks were last compared

    @property
    def held(self) -> set[KafkaPartition]:
        """The partitions paused until their re-fetch."""
        return set(self._held)

    def deliverable(self, consumer: AIOKafkaConsumer, tp: KafkaPartition,
                    recs: list[Any]) -> list[Any]:
        """The records of ``tp`` before any hole; a hole makes ``tp`` re-fetch from it,
        unless the fetch explains it."""
        verdict = self.continuity.check(ours(tp), recs, explained_by(consumer, tp))
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
                consumer.seek(tp, verdict.refetch_from)  # drops what was prefetched
            except IllegalStateError:  # no longer ours: the next owner starts at the commit
                self.continuity.forget([ours(tp)])
            else:
                self._hold(consumer, tp)
                metrics.REFETCHES.labels(*labels).inc()
        return recs[:verdict.deliver]

    def _hold(self, consumer: AIOKafkaConsumer, tp: KafkaPartition) -> None:
        """Pause ``tp`` for the backoff, so the broker has time to write the missing batch."""
        consumer.pause(tp)
        if (timer := self._held.pop(tp, None)) is not None:
            timer.cancel()
        self._held[tp] = asyncio.get_running_loop().call_later(
            self._backoff, self._release, consumer, tp)

    def _release(self, consumer: AIOKafkaConsumer, tp: KafkaPartition) -> None:
        self._held.pop(tp, None)
        if self._may_resume(tp) and tp in consumer.assignment():
            consumer.resume(tp)

    def release_all(self) -> None:
        """Cancel every pending re-fetch pause (the partitions are revoked or the stream ends)."""
        for timer in self._held.values():
            timer.cancel()
        self._held.clear()

    def check_ends(self, consumer: AIOKafkaConsumer) -> None:
        """Once a second: does a partition's log end below where this worker is?"""
        now = asyncio.get_running_loop().time()
        if now - self._ends_checked >= 1.0:
            self._ends_checked = now
            for tp in consumer.assignment():
                if (high := consumer.highwater(tp)) is not None:
                    self.continuity.ends_at(ours(tp), high, now)
