"""The producer's send path: partitions as Kafka's partitioner, waits for every record,
follows its topics' metadata, bounds metadata waits."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from onceflow.kafka.delivery import DeliverySettings, OutboxTally
from onceflow.kafka.outbox_rows import SeqClock
from onceflow.kafka.producer import (
    MetadataTimeout,
    ProducerActor,
    all_settled,
    key_hash,
    key_partition,
)

KAFKA = DefaultPartitioner()


@given(keys=st.lists(st.binary(max_size=40), min_size=1, max_size=50),
       count=st.integers(min_value=1, max_value=64))
def test_key_partition_is_kafkas_default_partitioner(keys: list[bytes], count: int) -> None:
    partitions = list(range(count))
    for key in keys * 2:  # the second time from the remembered hashes
        assert key_partition(key, partitions) == KAFKA(key, partitions, partitions)


def test_remembered_hashes_are_bounded() -> None:
    for n in range(20_000):
        key_hash(n.to_bytes(4, "big"))
    assert key_hash.cache_info().currsize <= 16_384


def test_sequence_numbers_taken_at_once_are_those_of_one_call_each() -> None:
    clock = SeqClock()
    clock.last = 2**62  # ahead of the real clock, so it stands still
    assert list(clock.take(3)) == [2**62 + 1, 2**62 + 2, 2**62 + 3]
    assert clock() == 2**62 + 4 and list(clock.take(0)) == []


def test_a_send_waits_for_every_record_and_raises_a_failure() -> None:
    """Settled in order per lane, as lanes do, but also out of order: nothing is missed."""
    async def scenario(fail: bool, in_order: bool) -> str:
        loop = asyncio.get_running_loop()
        lanes = [[loop.create_future() for _ in range(3)] for _ in range(2)]
        waiting = asyncio.create_task(all_settled(lanes))
        order = [f for lane in lanes for f in lane]
        for future in order if in_order else order[::-1][:-1]:  # the first left open
            await asyncio.sleep(0)
            assert not waiting.done()
            future.set_result(None)
        if not in_order:
            await asyncio.sleep(0)
            assert not waiting.done()  # every lane's last is settled, one record is not
            if fail:
                order[0].set_exception(RuntimeError("not delivered"))
            else:
                order[0].set_result(None)
        try:
            await waiting
        except RuntimeError as error:
            return str(error)
        return "settled"

    assert asyncio.run(scenario(fail=False, in_order=True)) == "settled"
    assert asyncio.run(scenario(fail=False, in_order=False)) == "settled"
    assert asyncio.run(scenario(fail=True, in_order=False)) == "not delivered"


def test_a_failed_lane_fails_the_send_at_once() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        lanes = [[loop.create_future() for _ in range(2)] for _ in range(2)]
        for future in lanes[0]:  # a lane that failed fails all its records together
            future.set_exception(RuntimeError("lane failed"))
        with pytest.raises(RuntimeError, match="lane failed"):
            await asyncio.wait_for(all_settled(lanes), 1)  # the other lane still open

    asyncio.run(scenario())


def unopened(max_block: float = 5.0) -> ProducerActor:
    """A producer actor whose client is never opened (its own methods tried alone)."""
    return ProducerActor(
        options={}, delivery=DeliverySettings(60, 30, 0, 0.1, 0.05, 1), max_block=max_block,
        outbox=None, tally=OutboxTally(), io=None,  # type: ignore[arg-type]
        start_timeout=5.0, on_fatal=lambda name, error: None)


class Cluster:
    """What aiokafka's cluster metadata tells its listeners: topic -> partition ids."""

    def __init__(self, **topics: set[int]):
        self.topics = topics

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.topics.get(topic)


def test_a_metadata_update_with_more_partitions_is_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    actor = unopened()
    actor._partitions = {"out": [0, 1], "dead": [0]}
    with caplog.at_level(logging.WARNING):
        actor._follow(Cluster(out={0, 1}))  # unchanged; "dead" left out of the update
        assert actor._partitions == {"out": [0, 1], "dead": [0]} and not caplog.records
        actor._follow(Cluster(out={3, 0, 2, 1}, dead={0}))
    assert actor._partitions == {"out": [0, 1, 2, 3], "dead": [0]}
    assert "output topic 'out' has 4 partitions now (was 2)" in caplog.text
    assert key_partition(b"k", actor._partitions["out"]) == KAFKA(b"k", [0, 1, 2, 3], [])


def test_a_metadata_wait_past_max_block_names_the_topic() -> None:
    async def scenario() -> None:
        with pytest.raises(MetadataTimeout, match=r"no metadata for output topic 'out' within "
                           r"max-block \(0.05s\)"):
            await unopened(max_block=0.05)._bounded(asyncio.Event().wait(), "out")

    asyncio.run(scenario())
