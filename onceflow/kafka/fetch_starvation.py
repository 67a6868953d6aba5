"""Acting on fetch starvation: a wider fetch max wait, at its ceiling a new stream.

``FetchWatch`` (pure) says when a partition starves (records wait in its log,
its fetches bring none); this is what the consumer does about it, kept out of
``ConsumerActor``. It doubles aiokafka's fetch max wait (its fetcher's private
``_fetch_max_wait_ms``, read per request) up to ``MAX_FETCH_WAIT_MS``; starving
at that ceiling raises ``FetchStarved``, which fails the stream, and the
supervisor re-creates it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition
from aiokafka.errors import IllegalStateError, KafkaError

from onceflow.actors import metrics
from onceflow.kafka.continuity import Continuity
from onceflow.kafka.fetch_watch import FetchWatch, Starved
from onceflow.kafka.kafka_parts import ours

log = logging.getLogger(__name__)

#: Seconds of fetching a partition without records while its log holds some, before
#: the fetch's max wait is doubled (or, at the ceiling, the stream re-created).
STARVED_AFTER = 2.0
#: The longest max wait starvation widens a fetch to (Tansu needed ~100 ms at the tail
#: of 150,000 records in 5-record batches); never above half the request timeout.
MAX_FETCH_WAIT_MS = 5_000


class FetchStarved(RuntimeError):
    """Fetches at the widest max wait still brought no records while the log holds some."""


class FetchStarvation:
    """One consumer stream's starving partitions and its fetch max wait."""

    def __init__(self, options: Mapping[str, Any], continuity: Continuity) -> None:
        self._watch = FetchWatch(STARVED_AFTER)
        self._continuity = continuity  # the offsets each partition expects next
        self._starving: set[KafkaPartition] = set()  # widened for, no records since
        self._ceiling = min(MAX_FETCH_WAIT_MS, int(options.get("request_timeout_ms", 40_000)) // 2)
        #: The least poll timeout a widened max wait needs (0: none widened yet).
        self.poll_floor_ms = 0

    def idle(self) -> None:
        """Nothing was fetched meanwhile (every partition paused)."""
        self._watch.idle()

    def forget(self, revoked: set[KafkaPartition]) -> None:
        self._watch.forget(ours(tp) for tp in revoked)
        self._starving -= revoked

    async def after_fetch(self, consumer: AIOKafkaConsumer,
                          batches: Mapping[KafkaPartition, Sequence[Any]]) -> None:
        """After a fetch: does a partition starve (records wait, none come)?"""
        now = asyncio.get_running_loop().time()
        paused = consumer.paused()
        for tp in consumer.assignment():
            fetched = bool(batches.get(tp))
            expected, high = self._continuity.expected(ours(tp)), consumer.highwater(tp)
            if (not fetched and tp not in paused and expected is not None
                    and high is not None and high > expected):
                # The client's position may be past it: a transaction marker at the end
                # is skipped without a record.
                expected = max(expected, await _position(consumer, tp))
            if fetched and tp in self._starving:
                self._starving.discard(tp)
                log.info("%s[%d]: fetches bring records again (fetch max wait now %d ms)",
                     tp.topic, tp.partition, _max_wait_ms(consumer) or -1)
            starved = self._watch.observe(ours(tp), now, expected=expected, highwater=high,
                                          fetched=fetched, paused=tp in paused)
            if starved is not None:
                self._starved(consumer, tp, starved)

    def _starved(self, consumer: AIOKafkaConsumer, tp: KafkaPartition,
                 starved: Starved) -> None:
        """Widen the fetches' max wait; at the ceiling, fail the stream (re-created)."""
        metrics.FETCH_STARVED.labels(tp.topic, str(tp.partition)).inc()
        wait = _max_wait_ms(consumer)
        what = (f"{tp.topic}[{tp.partition}]: fetches at offset {starved.expected} brought "
                f"no records for {starved.seconds:.1f}s while the log ends at "
                f"{starved.highwater}")
        if wait is None or wait >= self._ceiling:
            raise FetchStarved(f"{what}, at a fetch max wait of {wait} ms: re-creating the "
                               f"consumer")
        wider = min(max(2 * wait, 1), self._ceiling)
        consumer._fetcher._fetch_max_wait_ms = wider
        self.poll_floor_ms = max(self.poll_floor_ms, wider + 100)
        self._starving.add(tp)
        log.warning("%s: the broker answers within the fetch max wait (%d ms) with nothing "
                    "(Tansu does when finding the offset takes longer); waiting up to %d ms "
                    "from now (docs/guide/operations-and-health.md, \"A fetch that brings "
                    "nothing\")", what, wait, wider)


async def _position(consumer: AIOKafkaConsumer, tp: KafkaPartition) -> int:
    """The client's next fetch offset of ``tp`` (-1 if it has none now)."""
    try:
        return int(await asyncio.wait_for(consumer.position(tp), 1.0))
    except (TimeoutError, IllegalStateError, KafkaError):
        return -1


def _max_wait_ms(consumer: AIOKafkaConsumer) -> int | None:
    """The fetcher's max wait (aiokafka keeps it on its private fetcher), if readable."""
    wait = getattr(getattr(consumer, "_fetcher", None), "_fetch_max_wait_ms", None)
    return wait if isinstance(wait, int) else None
