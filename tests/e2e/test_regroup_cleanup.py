"""Re-keying exactly once under SIGKILL: a re-keying republisher and the cleanup behind it.

50,000 plain-JSON orders (6 partitions, keyed by customer) -> ``regroup``
(two worker processes) writes one line per order line, keyed by sku, into a
4-partition regrouped topic -> ``cleanup`` (two worker processes) copies it
into a 4-partition pristine topic (``onceflow/examples/regroup.py``). All four
processes are SIGKILLed again and again while the orders flow. The regrouped
topic holds re-sent lines; a plain aiokafka consumer then finds every line
in the pristine topic exactly once, and per sku in the order of its orders
partition.
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

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo

ORDERS, ORDER_PARTITIONS, LINE_PARTITIONS = 50_000, 6, 4
KILLS_EACH = 6  # per process: 24 in all
Line = tuple[str, int]  # (order, line index)


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


def test_a_re_keyed_topic_cleaned_under_sigkills_is_pristine_for_a_plain_consumer(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    bootstrap = kafka_service.address
    topics = {"ONCEFLOW_REGROUP_ORDERS": unique_name("orders"),
              "ONCEFLOW_REGROUP_REGROUPED": unique_name("bysku"),
              "ONCEFLOW_REGROUP_PRISTINE": unique_name("pristine")}
    source, regrouped, pristine = topics.values()
    asyncio.run(harness.create_topic(bootstrap, source, ORDER_PARTITIONS))
    for topic in (regrouped, pristine):
        asyncio.run(harness.create_topic(bootstrap, topic, LINE_PARTITIONS))
    groups = {"regroup": unique_name("g"), "cleanup": unique_name("g")}
    prefix = unique_name("p")

    def worker(pipeline: str, name: str) -> harness.WorkerProcess:
        settings = {"onceflow.pipeline": f"onceflow.examples.regroup:{pipeline}",
                    "onceflow.kafka.bootstrap-servers": bootstrap,
                    "onceflow.kafka.group-id": groups[pipeline],
                    "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                    "onceflow.stores.redis.key-prefix": prefix,
                    # A restarted worker waits for the killed one's session to expire.
                    "onceflow.kafka.session-timeout": "3s",
                    "onceflow.kafka.heartbeat-interval": "1s"}
        argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
        return harness.WorkerProcess(argv, {**os.environ, **topics}, tmp_path, name)

    workers = [worker(pipeline, f"{pipeline}-{n}") for pipeline in groups for n in (1, 2)]
    rng = random.Random(12)

    async def scenario() -> None:
        ends, *_ = await asyncio.gather(
            harness.produce(bootstrap, source, orders(ORDERS), seconds=50),
            *(harness.kill_repeatedly(process, KILLS_EACH, rng) for process in workers))
        async with harness.CommittedOffsets(bootstrap, groups["regroup"]) as committed:
            assert await committed.wait_for(source, ends, 120), f"see {tmp_path}"
        regrouped_ends = await harness.read_ends(bootstrap, regrouped, LINE_PARTITIONS, 1.0)
        async with harness.CommittedOffsets(bootstrap, groups["cleanup"]) as committed:
            assert await committed.wait_for(regrouped, regrouped_ends, 120), f"see {tmp_path}"

    asyncio.run(scenario())
    assert [process.terminate(10) for process in workers] == [0] * 4, f"see {tmp_path}"
    inputs = asyncio.run(harness.read_all(bootstrap, source, ORDER_PARTITIONS, quiet=1.0))
    want = lines_by_root(inputs)
    copies = asyncio.run(harness.read_all(bootstrap, regrouped, LINE_PARTITIONS, quiet=1.0))
    outputs = asyncio.run(plain_read(bootstrap, pristine, LINE_PARTITIONS, len(want)))
    got = [json.loads(r.value or b"") for r in sorted(outputs, key=lambda r: (r.partition,
                                                                               r.offset))]
    duplicates = len(copies) - len({r.value for r in copies})
    context = (f"{sum(p.kills for p in workers)} kills, {len(inputs)} orders, {len(want)} lines, "
               f"regrouped {len(copies)} ({duplicates} re-sent), pristine {len(outputs)}; "
               f"logs {tmp_path}")
    print(context)
    assert len(inputs) == ORDERS and all(p.kills == KILLS_EACH for p in workers), context
    assert duplicates > 0, f"the kills re-sent nothing: {context}"
    seen = Counter((line["order"], line["line"]) for line in got)
    assert seen.keys() == want.keys(), f"missing or extra lines: {context}"
    assert max(seen.values()) == 1, f"duplicates: {context} {seen.most_common(3)}"
    last: dict[tuple[str, int], tuple[int, int]] = {}  # (sku, root partition) -> (offset, index)
    for record, line in zip(sorted(outputs, key=lambda r: (r.partition, r.offset)), got,
                            strict=True):
        sku, root, offset, index = want[(line["order"], line["line"])]
        assert (line["sku"], record.key) == (sku, sku.encode()), context
        assert last.get((sku, root), (-1, -1)) < (offset, index), f"out of order: {context}"
        last[(sku, root)] = (offset, index)
