"""The log check's probe consumer against a real broker (``log_marks.LogCheck.holds``).

The check runs before every send and write (``checkpoint.log_watch``), so its
consumer is kept open between checks, paused. What one check learnt (a
partition's high watermark, a record it fetched) must never answer for the
next: a topic re-created between two checks is found, shorter or grown past.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition
from helpers import create_topic, produce
from test_recreated_topic import _recreate

from onceflow.checkpoint.log_marks import LogCheck, LogMark, LogReplaced, mark_of
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.fencing import Guard


class NoRows:
    """No stored marks: ``holds`` is given its marks directly."""

    def load(self, stage_id: str, keys: Sequence[str]) -> Mapping[str, bytes]:
        return {}

    def save(self, stage_id: str, rows: Mapping[str, bytes], *,
             guard: Guard | None = None) -> None:
        raise AssertionError("the probe writes nothing")


async def _mark(bootstrap: str, topic: str, offset: int) -> LogMark:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = KafkaPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        fetched = await consumer.getmany(tp, timeout_ms=5000, max_records=1)
        return mark_of(fetched[tp][0])
    finally:
        await consumer.stop()


def _records(tag: str, count: int) -> list[tuple[bytes | None, bytes]]:
    return [(b"k", f"{tag}-{i}".encode()) for i in range(count)]


@pytest.mark.parametrize("new_count", [3, 40], ids=["shorter", "grown_past"])
def test_the_kept_probe_finds_a_topic_recreated_between_two_checks(
    kafka_service: ServiceInfo, unique_name: Callable[..., str], new_count: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bootstrap, topic = kafka_service.address, unique_name("probed")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, _records("old", 20))
    mark = asyncio.run(_mark(bootstrap, topic, 10))

    async def scenario() -> None:
        check = LogCheck(NoRows(), {"bootstrap_servers": bootstrap}, timeout=30)
        try:
            for _ in range(3):  # the same consumer, check after check
                await check.holds({(topic, 0): mark})
            probe = check._consumer
            assert probe is not None
            await check.holds({(topic, 0): mark})
            assert check._consumer is probe  # kept, not opened per check
            await asyncio.to_thread(produce, bootstrap, topic, _records("old-more", 40))
            later = await _mark(bootstrap, topic, 45)  # past the end the last checks saw
            await check.holds({(topic, 0): later})
            await _recreate(bootstrap, topic, 1)
            await asyncio.to_thread(produce, bootstrap, topic, _records("new", new_count))
            with pytest.raises(LogReplaced) as refused:
                await check.holds({(topic, 0): mark})
            why = refused.value.why
            assert ("differs" in why) if new_count > 10 else why == f"it now ends at offset " \
                f"{new_count}", why
        finally:
            await check.close()
        assert check._consumer is None
        with pytest.raises(LogReplaced):  # asked after its close: a consumer of its own
            await check.holds({(topic, 0): mark})
        assert check._consumer is None

    with caplog.at_level(logging.INFO, logger="aiokafka"):
        asyncio.run(scenario())
    # Each of the 7 checks assigns its probe anew, and aiokafka says so at INFO: not once
    # per check. The one line left is this test's own ``_mark`` (``later``).
    said = [r.getMessage() for r in caplog.records if r.name.startswith("aiokafka")]
    assigned = [m for m in said if "Updating subscribed topics" in m]
    assert said and len(assigned) == 1, said
