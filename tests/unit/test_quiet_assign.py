"""``assign_quietly``: aiokafka's INFO line about an assign dropped for that call only."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition
from aiokafka.errors import IllegalStateError

from onceflow.kafka.quiet_assign import assign_quietly

SAID = "Updating subscribed topics"
HEARD = ["Updating subscribed topics to: frozenset({'heard'})"]


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if SAID in r.getMessage()]


def _with_consumer(caplog: pytest.LogCaptureFixture,
                   body: Callable[[AIOKafkaConsumer], None]) -> None:
    """``body`` with a consumer that is never started, aiokafka's INFO lines captured."""
    async def scenario() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:9")
        try:
            body(consumer)
        finally:
            await consumer.stop()

    with caplog.at_level(logging.INFO, logger="aiokafka"):
        asyncio.run(scenario())


def test_a_quiet_assign_says_nothing_and_the_next_plain_one_is_heard(
        caplog: pytest.LogCaptureFixture) -> None:
    def body(consumer: AIOKafkaConsumer) -> None:
        assign_quietly(consumer, [KafkaPartition("quiet", 0)])
        assert consumer.assignment() == {KafkaPartition("quiet", 0)}  # assigned all the same
        assert _lines(caplog) == []
        consumer.assign([KafkaPartition("heard", 1)])
        assert _lines(caplog) == HEARD

    _with_consumer(caplog, body)


def test_an_assign_that_fails_leaves_the_line_heard_afterwards(
        caplog: pytest.LogCaptureFixture) -> None:
    def body(consumer: AIOKafkaConsumer) -> None:
        consumer.subscribe(topics=["subscribed"])  # assign is refused after a subscribe
        caplog.clear()
        with pytest.raises(IllegalStateError):
            assign_quietly(consumer, [KafkaPartition("quiet", 0)])
        consumer.unsubscribe()
        consumer.assign([KafkaPartition("heard", 0)])
        assert _lines(caplog) == HEARD

    _with_consumer(caplog, body)
