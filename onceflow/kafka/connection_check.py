"""Alpakka's connection checker: fail a consumer stream whose broker stopped answering.

A frozen broker answers nothing, so the Kafka client would wait forever; a
metadata request every interval that keeps failing raises
:class:`ConnectionLost`, which fails the stream so the supervisor re-creates
it. Runs as a task on the consumer's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionCheck:
    """``onceflow.kafka.connection-checker``: Alpakka's names and meaning."""

    max_retries: int
    interval: float
    backoff_factor: float


class ConnectionLost(ConnectionError):
    """The broker did not answer ``max_retries + 1`` checks in a row."""


async def check_connection(consumer: AIOKafkaConsumer, check: ConnectionCheck) -> None:
    """Ask for metadata every interval; too many silent failures in a row raise."""
    failures, delay = 0, check.interval
    while True:
        await asyncio.sleep(delay)
        try:
            await asyncio.wait_for(consumer.topics(), timeout=check.interval)
        except (TimeoutError, KafkaError) as error:
            failures += 1
            log.warning("connection check %d failed: %r", failures, error)
            if failures > check.max_retries:
                raise ConnectionLost(f"broker silent for {failures} checks") from error
            delay = check.interval * check.backoff_factor ** failures
        else:
            failures, delay = 0, check.interval
