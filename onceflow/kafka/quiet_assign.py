"""An ``assign`` without aiokafka's INFO line, for consumers that assign over and over.

aiokafka logs every ``assign`` at INFO ("Updating subscribed topics to: ..."). The log
check's probe assigns anew before each check, and a check runs before every send and
state write (``checkpoint.log_watch``): several times a second, so a worker's log was
mostly that line, hiding what an operator needs to read. ``assign_quietly`` drops the
line for the call it makes, on its own thread; every other consumer's stays.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition

__all__ = ["assign_quietly"]


class _QuietFor(logging.Filter):
    """Drops the records logged by the threads that are assigning quietly right now."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return threading.get_ident() not in self.threads


_quiet = _QuietFor()
logging.getLogger("aiokafka.consumer.subscription_state").addFilter(_quiet)


def assign_quietly(consumer: AIOKafkaConsumer, partitions: Iterable[KafkaPartition]) -> None:
    """``consumer.assign(partitions)``, without aiokafka's INFO line about it."""
    me = threading.get_ident()
    _quiet.threads.add(me)
    try:
        consumer.assign(list(partitions))
    finally:
        _quiet.threads.discard(me)
