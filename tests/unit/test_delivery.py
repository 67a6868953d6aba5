"""Lane and outbox logic with a scripted broker (pure logic; the real broker is in tests/e2e)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence

import pytest

from onceflow.kafka.delivery import (
    DeliveryFailed,
    DeliverySettings,
    Lanes,
    OutboxTally,
    OutboxWriter,
)
from onceflow.kafka.outbox_rows import SeqClock, decode_record, encode_record
from onceflow.stages.outcome import Output
from onceflow.stores.base import OutboxKey, StateStore
from onceflow.stores.fencing import Guard

FAST = DeliverySettings(delivery_timeout=0.2, request_timeout=0.2, retries=2,
                        retry_backoff=0.01, reconnect_backoff=0.01, reconnect_backoff_max=0.02)


class MemoryOutbox(StateStore):
    """The outbox part of a store, in a dict."""

    def __init__(self) -> None:
        self.rows: dict[OutboxKey, bytes] = {}
        self.most = 0

    def outbox_append(self, rows: Mapping[OutboxKey, bytes], *, guard: Guard | None = None
                      ) -> None:
        self.rows.update(rows)
        self.most = max(self.most, len(self.rows))

    def outbox_remove(self, keys: Sequence[OutboxKey]) -> None:
        for key in keys:
            self.rows.pop(key, None)

    def outbox_load(self) -> dict[str, list[tuple[int, bytes]]]:
        lanes: dict[str, list[tuple[int, bytes]]] = {}
        for (lane, seq), row in sorted(self.rows.items()):
            lanes.setdefault(lane, []).append((seq, row))
        return lanes

    def load(self, stage_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        raise NotImplementedError

    def save(self, stage_id: str, rows: Mapping[str, bytes], *, guard: Guard | None = None
             ) -> None:
        raise NotImplementedError

    def scan(self, stage_id: str) -> Iterator[tuple[str, bytes]]:
        raise NotImplementedError

    def claim_homes(self, stage_id: str, proposals: Mapping[str, str]) -> dict[str, str]:
        raise NotImplementedError

    def add_stats(self, counters: Mapping[str, int]) -> None:
        raise NotImplementedError

    def read_stats(self) -> dict[str, int]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Broker:
    """Takes up to ``batch`` records per send while up; hangs while down."""

    def __init__(self, batch: int = 3) -> None:
        self.up = True
        self.batch = batch
        self.log: list[bytes] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def send(self, topic: str, partition: int, outputs: Sequence[Output]) -> int:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            while not self.up:
                await asyncio.sleep(0.01)
            taken = outputs[:self.batch]
            self.log.extend(o.value for o in taken)
            return len(taken)
        finally:
            self.in_flight -= 1


async def settled_down(lanes: Lanes, tally: OutboxTally, store: MemoryOutbox) -> None:
    """Wait (at most 5 s) until every lane is empty and the outbox deleted what was delivered:
    the tally drops when a record is acknowledged, its row goes a moment later."""
    deadline = asyncio.get_running_loop().time() + 5
    while lanes.undelivered() or tally.value or store.rows:
        if asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.01)


def records(start: int, stop: int) -> list[Output]:
    return [Output("t", b"k", str(i).encode(), (("h", b"x"),)) for i in range(start, stop)]


def test_an_outbox_row_decodes_to_the_record_it_encodes() -> None:
    for output in (Output("a.b-c_d", None, b"\x00\xff", ()),
                   Output("t", b"key", b"v", (("event", b"\x01"), ("x", b"")))):
        assert decode_record(encode_record(output)) == output


def test_a_lane_sends_in_order_one_batch_at_a_time() -> None:
    async def scenario() -> Broker:
        broker = Broker()
        lanes = Lanes(broker.send, FAST, None)
        settled = [f for i in range(0, 30, 5) for f in lanes.lane("t", 0).add(records(i, i + 5))]
        await asyncio.gather(*settled)
        return broker

    broker = asyncio.run(scenario())
    assert broker.log == [str(i).encode() for i in range(30)]
    assert broker.most_in_flight == 1


def test_an_outage_outboxes_the_lane_then_delivers_it_in_order_and_empties_it() -> None:
    async def scenario() -> tuple[Broker, MemoryOutbox, OutboxTally]:
        broker, store, tally = Broker(), MemoryOutbox(), OutboxTally()
        lanes = Lanes(broker.send, FAST, OutboxWriter(store, tally))
        lane = lanes.lane("t", 0)
        await asyncio.gather(*lane.add(records(0, 4)))
        broker.up = False
        await asyncio.gather(*lane.add(records(4, 10)))  # settled: in the outbox
        assert lane.outboxing and tally.value == 6 and len(store.rows) == 6
        await asyncio.gather(*lane.add(records(10, 12)))  # behind the outbox, into it too
        assert tally.value == 8 and len(store.rows) == 8
        broker.up = True
        await settled_down(lanes, tally, store)
        await asyncio.gather(*lane.add(records(12, 14)))
        assert not lane.outboxing
        return broker, store, tally

    broker, store, tally = asyncio.run(scenario())
    assert broker.log == [str(i).encode() for i in range(14)]
    assert store.rows == {} and store.most == 8 and tally.value == 0


def test_without_an_outbox_a_spent_bound_fails_the_lane_and_everything_behind() -> None:
    async def scenario() -> None:
        broker = Broker()
        broker.up = False
        lane = Lanes(broker.send, FAST, None).lane("t", 0)
        with pytest.raises(DeliveryFailed, match="not delivered"):
            await asyncio.gather(*lane.add(records(0, 3)))
        later = lane.add(records(3, 4))
        with pytest.raises(DeliveryFailed):
            await asyncio.gather(*later)
        broker.up = True
        await asyncio.sleep(0.05)
        assert broker.log == []  # nothing after the failure is ever sent

    asyncio.run(scenario())


def test_a_restarted_producer_sends_the_outbox_before_anything_new() -> None:
    """Rows of every worker of the pipeline (one that died too), merged in seq order."""
    async def scenario() -> tuple[Broker, MemoryOutbox]:
        store = MemoryOutbox()
        mine, other = records(0, 5), records(5, 7)
        store.outbox_append({("t|0", 100 + 2 * i): encode_record(o) for i, o in enumerate(mine)})
        store.outbox_append({("t|0", 111 + i): encode_record(o) for i, o in enumerate(other)})
        broker, tally = Broker(), OutboxTally()
        lanes = Lanes(broker.send, FAST, OutboxWriter(store, tally))
        assert await lanes.adopt() == 7 and tally.value == 7
        lane = lanes.lane("t", 0)
        await asyncio.gather(*lane.add(records(7, 10)))  # settled: behind the outbox, in it
        assert all(seq > 112 for _, seq in store.rows if seq not in range(100, 113))
        await settled_down(lanes, tally, store)
        return broker, store

    broker, store = asyncio.run(scenario())
    assert broker.log == [str(i).encode() for i in range(10)]
    assert store.rows == {}


def test_outbox_sequence_numbers_increase_even_when_the_clock_does_not() -> None:
    clock = SeqClock()
    clock.last = 2**62  # a row written by a worker whose clock ran ahead
    assert [clock() for _ in range(3)] == [2**62 + 1, 2**62 + 2, 2**62 + 3]


def test_adopting_on_assignment_queues_only_rows_the_lanes_do_not_hold() -> None:
    """A worker that left leaves rows behind; taking over its partitions takes them too."""
    async def scenario() -> tuple[Broker, MemoryOutbox, list[int]]:
        store, tally, broker = MemoryOutbox(), OutboxTally(), Broker()
        broker.up = False
        lanes = Lanes(broker.send, FAST, OutboxWriter(store, tally))
        await asyncio.gather(*lanes.lane("t", 0).add(records(0, 3)))  # ours, outboxed
        assert tally.value == 3
        store.outbox_append({("t|1", 5): encode_record(records(3, 4)[0])})  # the leaver's
        adopted = [await lanes.adopt(), await lanes.adopt()]
        assert tally.value == 4
        broker.up = True
        await settled_down(lanes, tally, store)
        return broker, store, adopted

    broker, store, adopted = asyncio.run(scenario())
    assert adopted == [1, 0]
    assert sorted(broker.log) == [b"0", b"1", b"2", b"3"] and store.rows == {}
