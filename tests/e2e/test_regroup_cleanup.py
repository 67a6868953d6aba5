"""Re-keying exactly once under SIGKILL: a re-keying republisher and the cleanup behind it.

50,000 plain-JSON orders (6 partitions, keyed by customer) -> ``regroup``
(two worker processes) writes one line per order line, keyed by sku, into a
4-partition regrouped topic -> ``cleanup`` (two worker processes) copies it
into a 4-partition pristine topic (``onceflow/examples/regroup.py``). All four
processes are SIGKILLed again and again while the orders flow. The regrouped
topic holds re-sent lines (the kills may leave some; a producer's re-send of
each partition's first lines always does); a plain aiokafka consumer then finds every line
in the pristine topic exactly once, and per sku in the order of its orders
partition.

The second test puts a first re-keying (by order id) in front, so ``regroup``
reads a topic that was itself re-keyed and holds copies: each orders
partition reaches the regrouped one through several partitions, which
interleave. The pristine topic must still hold every line once, in order
along each route (root partition, then the partitions in between).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.stages.origin import CHAIN_HEADER, decode_chain, header

ORDER_PARTITIONS, LINE_PARTITIONS, RESHUFFLED_PARTITIONS = 6, 4, 3
Line = tuple[str, int]  # (order, line index)
RESENT_EACH = 50  # lines of each regrouped partition sent again


def orders(n: int, seed: int = 12) -> list[tuple[bytes | None, bytes]]:
    """``n`` orders with 1-2 lines each, keyed by customer (so spread over the partitions)."""
    rng = random.Random(seed)
    out: list[tuple[bytes | None, bytes]] = []
    for i in range(n):
        customer = f"c-{rng.randrange(500)}"
        lines = [{"sku": f"s-{rng.randrange(200)}", "qty": rng.randint(1, 9)}
                 for _ in range(rng.randint(1, 2))]
        out.append((customer.encode(), json.dumps(
            {"order": f"o-{i}", "customer": customer, "lines": lines}).encode()))
    return out


def lines_by_root(inputs: list[ConsumerRecord[bytes, bytes]]
                  ) -> dict[Line, tuple[str, int, int, int]]:
    """Every expected line -> (sku, root partition, root offset, line index)."""
    want = {}
    for record in inputs:
        order = json.loads(record.value or b"")
        for index, line in enumerate(order["lines"]):
            want[(order["order"], index)] = (line["sku"], record.partition, record.offset, index)
    return want


async def plain_read(bootstrap: str, topic: str, partitions: int, want: int
                     ) -> list[ConsumerRecord[bytes, bytes]]:
    """The topic as any Kafka consumer reads it: from the start, until ``want`` records
    and 3 quiet seconds (a record more than expected must show up too)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    found: list[ConsumerRecord[bytes, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline, last = time.monotonic() + 60, time.monotonic()
        while time.monotonic() < deadline and (len(found) < want
                                               or time.monotonic() - last < 3):
            for records in (await consumer.getmany(timeout_ms=200)).values():
                found += records
                last = time.monotonic()
    finally:
        await consumer.stop()
    return found


async def resend(bootstrap: str, topic: str, partitions: int, count: int) -> None:
    """Send each partition's first ``count`` records again, headers and all, as a producer
    does after a lost acknowledgement. Whether a SIGKILL leaves copies depends on where it
    lands (a worker killed before it produced anything leaves none), so the copies the
    cleanup must drop do not depend on the host's speed."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        first: dict[int, list[ConsumerRecord[bytes, bytes]]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + 60
        while any(len(rows) < count for rows in first.values()):
            assert time.monotonic() < deadline, f"{topic}: fewer than {count} records"
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                first[tp.partition] += records
        sends = [await producer.send(topic, record.value, key=record.key,
                                     partition=record.partition, headers=list(record.headers))
                 for rows in first.values() for record in rows[:count]]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
        await consumer.stop()


def test_a_re_keyed_topic_cleaned_under_sigkills_is_pristine_for_a_plain_consumer(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    # Two processes each for regroup and cleanup, 6 SIGKILLs each: 24.
    regroup_and_clean(kafka_service, redis_service, tmp_path, unique_name, orders_n=50_000,
                      processes={"regroup": 2, "cleanup": 2}, kills_each=6, seconds=50)


def test_a_topic_re_keyed_twice_and_cleaned_under_sigkills_is_pristine(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    # One process each for reshuffle, regroup and cleanup, 5 SIGKILLs each: 15.
    regroup_and_clean(kafka_service, redis_service, tmp_path, unique_name, orders_n=20_000,
                      processes={"reshuffle": 1, "regroup": 1, "cleanup": 1}, kills_each=5,
                      seconds=25)


def regroup_and_clean(kafka: ServiceInfo, redis: ServiceInfo, tmp_path: Path,
                      unique_name: Callable[..., str], *, orders_n: int,
                      processes: dict[str, int], kills_each: int, seconds: float) -> None:
    """Run the pipelines of ``onceflow.examples.regroup`` named in ``processes`` (that
    many worker processes each) under SIGKILLs while ``orders_n`` orders flow, then read
    the pristine topic as a plain consumer and check it line by line."""
    bootstrap = kafka.address
    topics = {"ONCEFLOW_REGROUP_ORDERS": unique_name("orders"),
              "ONCEFLOW_REGROUP_REGROUPED": unique_name("bysku"),
              "ONCEFLOW_REGROUP_PRISTINE": unique_name("pristine")}
    source, regrouped, pristine = topics.values()
    asyncio.run(harness.create_topic(bootstrap, source, ORDER_PARTITIONS))
    for topic in (regrouped, pristine):
        asyncio.run(harness.create_topic(bootstrap, topic, LINE_PARTITIONS))
    regroup_input, regroup_partitions = source, ORDER_PARTITIONS
    if "reshuffle" in processes:
        regroup_input = topics["ONCEFLOW_REGROUP_RESHUFFLED"] = unique_name("byorder")
        regroup_partitions = RESHUFFLED_PARTITIONS
        asyncio.run(harness.create_topic(bootstrap, regroup_input, RESHUFFLED_PARTITIONS))
    groups = {pipeline: unique_name("g") for pipeline in processes}
    prefix = unique_name("p")

    def worker(pipeline: str, name: str) -> harness.WorkerProcess:
        settings = {"onceflow.pipeline": f"onceflow.examples.regroup:{pipeline}",
                    "onceflow.kafka.bootstrap-servers": bootstrap,
                    "onceflow.kafka.group-id": groups[pipeline],
                    "onceflow.stores.redis.url": f"redis://{redis.address}/0",
                    "onceflow.stores.redis.key-prefix": prefix,
                    # A restarted worker waits for the killed one's session to expire.
                    "onceflow.kafka.session-timeout": "3s",
                    "onceflow.kafka.heartbeat-interval": "1s"}
        argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
        return harness.WorkerProcess(argv, {**os.environ, **topics}, tmp_path, name)

    workers = [worker(pipeline, f"{pipeline}-{n}") for pipeline, count in processes.items()
               for n in range(1, count + 1)]
    rng = random.Random(12)

    async def drained(group: str, topic: str, ends: dict[int, int]) -> None:
        async with harness.CommittedOffsets(bootstrap, group) as committed:
            assert await committed.wait_for(topic, ends, 120), f"see {tmp_path}"

    async def scenario() -> None:
        producing = asyncio.create_task(
            harness.produce(bootstrap, source, orders(orders_n), seconds=seconds))
        await asyncio.gather(*(harness.kill_repeatedly(p, kills_each, rng) for p in workers))
        ends = await producing
        if "reshuffle" in processes:
            await drained(groups["reshuffle"], source, ends)
            ends = await harness.read_ends(bootstrap, regroup_input, regroup_partitions, 1.0)
        await drained(groups["regroup"], regroup_input, ends)
        await resend(bootstrap, regrouped, LINE_PARTITIONS, RESENT_EACH)
        regrouped_ends = await harness.read_ends(bootstrap, regrouped, LINE_PARTITIONS, 1.0)
        await drained(groups["cleanup"], regrouped, regrouped_ends)

    asyncio.run(scenario())
    assert [process.terminate(10) for process in workers] == [0] * len(workers), f"see {tmp_path}"
    inputs = asyncio.run(harness.read_all(bootstrap, source, ORDER_PARTITIONS, quiet=1.0))
    want = lines_by_root(inputs)
    copies = asyncio.run(harness.read_all(bootstrap, regrouped, LINE_PARTITIONS, quiet=1.0))
    outputs = asyncio.run(plain_read(bootstrap, pristine, LINE_PARTITIONS, len(want)))
    outputs.sort(key=lambda r: (r.partition, r.offset))
    got = [json.loads(r.value or b"") for r in outputs]
    duplicates = len(copies) - len({r.value for r in copies})
    context = (f"{sum(p.kills for p in workers)} kills, {len(inputs)} orders, {len(want)} lines, "
               f"regrouped {len(copies)} ({duplicates} re-sent), pristine {len(outputs)}; "
               f"logs {tmp_path}")
    print(context)
    assert len(inputs) == orders_n and all(p.kills == kills_each for p in workers), context
    assert duplicates >= RESENT_EACH * LINE_PARTITIONS, f"the copies are missing: {context}"
    seen = Counter((line["order"], line["line"]) for line in got)
    assert seen.keys() == want.keys(), f"missing or extra lines: {context}"
    assert max(seen.values()) == 1, f"duplicates: {context} {seen.most_common(3)}"
    # Per sku and route, in position order. The route and position come from the chain
    # (root, any reshuffled hop, the regrouped hop), which must match the expected root.
    last: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[int, ...]] = {}
    for record, line in zip(outputs, got, strict=True):
        sku, root, offset, index = want[(line["order"], line["line"])]
        assert (line["sku"], record.key) == (sku, sku.encode()), context
        *hops, _ = decode_chain(header(record.headers, CHAIN_HEADER) or b"")
        assert (hops[0].topic, hops[0].partition, hops[0].offset) == (source, root, offset)
        assert hops[-1].index == index, context
        route = tuple((hop.topic, hop.partition) for hop in hops)
        position = (offset, *(hop.index for hop in hops))
        assert last.get((sku, route), (-1,)) < position, f"out of order: {context}"
        last[(sku, route)] = position
