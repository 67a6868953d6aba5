"""Aggregate keys that span input partitions, with two workers in one group.

Orders keyed by order id, totalled per customer. Without a repartition step
two workers would each fold their own partitions' orders into their own copy
of a customer's state and the last write would win (silently losing ~half of
the orders, as measured before the key-home check); with the check, those
orders are dead-lettered with the reason instead. With the repartition step
the totals are exact while both workers are SIGKILLed again and again.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from helpers import create_topic, stored_states
from recovery import kill_in_turn

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stores.redis_store import RedisStore

PARTITIONS = 4


def orders(count: int, customers: int, seed: int) -> list[tuple[bytes, bytes]]:
    """(order id, envelope) records: keyed by order id, so customers span partitions."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        order = {"id": f"o-{i}", "customer": f"c-{rng.randrange(customers)}",
                 "amount": rng.randint(1, 100)}
        envelope = Envelope(key=order["id"], payload=json.dumps(order).encode())
        out.append((order["id"].encode(), envelope.SerializeToString()))
    return out


def truth(records: list[tuple[bytes, bytes]]) -> dict[str, dict[str, int]]:
    totals: dict[str, Counter[str]] = {}
    for _, value in records:
        order = json.loads(Envelope.FromString(value).payload)
        totals.setdefault(order["customer"], Counter()).update(
            {"orders": 1, "amount": order["amount"]})
    return {c: {"orders": t["orders"], "amount": t["amount"]} for c, t in totals.items()}


class Group:
    """Two worker processes of one pipeline in one consumer group, on a test's own topics."""

    def __init__(self, kafka: ServiceInfo, redis: ServiceInfo, tmp_path: Path,
                 unique_name: Callable[..., str], pipeline: str):
        self.bootstrap = kafka.address
        self.topic, self.hop = unique_name("orders"), unique_name("hop")
        self.group, self.dead = unique_name("g"), unique_name("dlq")
        self.redis_url, self.prefix = f"redis://{redis.address}/0", unique_name("p")
        create_topic(self.bootstrap, self.topic, PARTITIONS)
        create_topic(self.bootstrap, self.dead, 1)
        settings = {"onceflow.pipeline": pipeline,  # a factory, given its topics here
                    "onceflow.pipeline-settings.topic": self.topic,
                    "onceflow.kafka.bootstrap-servers": self.bootstrap,
                    "onceflow.kafka.group-id": self.group,
                    "onceflow.kafka.dead-letter-topic": self.dead,
                    "onceflow.stores.redis.url": self.redis_url,
                    "onceflow.stores.redis.key-prefix": self.prefix}
        if pipeline.endswith(":build"):
            settings["onceflow.pipeline-settings.repartition-topic"] = self.hop
        argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
        self.workers = [harness.WorkerProcess(argv, os.environ, tmp_path, name) for name in "ab"]

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

        async def both_assigned() -> None:
            await asyncio.gather(*(w.assigned() for w in self.workers))

        asyncio.run(both_assigned())

    def drained(self, topic: str, ends: dict[int, int], timeout: float = 180) -> None:
        async def wait() -> bool:
            async with harness.CommittedOffsets(self.bootstrap, self.group) as committed:
                return await committed.wait_for(topic, ends, timeout)

        assert asyncio.run(wait()), f"{topic} not committed to {ends}; logs: {self.logs()}"

    def stop(self) -> list[int | None]:
        return [worker.terminate(20) for worker in self.workers]

    def logs(self) -> list[str]:
        return [str(log) for worker in self.workers for log in worker.logs]

    def store(self, pipeline_id: str) -> RedisStore:
        return RedisStore(self.redis_url, self.prefix, pipeline_id)


def test_without_repartition_two_workers_dead_letter_what_they_cannot_fold_exactly(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    g = Group(kafka_service, redis_service, tmp_path, unique_name,
              "onceflow.examples.orders:build_unaligned")
    g.start()
    records = orders(6_000, customers=150, seed=5)
    ends = asyncio.run(harness.produce(g.bootstrap, g.topic, records, 5))
    g.drained(g.topic, ends)
    folded = stored_states(g.store("orders-unaligned"), "per_customer")
    dead = {}  # source position -> (customer, amount, reason); a replay may repeat one
    for record in asyncio.run(harness.read_all(g.bootstrap, g.dead, 1)):
        headers = {k: v.decode() for k, v in record.headers}
        order = json.loads(Envelope.FromString(record.value).payload)
        dead[headers["onceflow.source"]] = (order["customer"], order["amount"],
                                            headers["onceflow.reason"])
    assert g.stop() == [0, 0]
    assert dead, "keys spanning partitions must be reported"
    for customer, _, reason in dead.values():
        assert "stage 'per_customer'" in reason and f"key '{customer}'" in reason
        assert f"{g.topic}/" in reason and "repartition" in reason, reason
    # Nothing lost, nothing double: every order is folded once or dead-lettered.
    accounted: dict[str, Counter[str]] = {c: Counter(t) for c, t in folded.items()}
    for customer, amount, _ in dead.values():
        accounted.setdefault(customer, Counter()).update({"orders": 1, "amount": amount})
    assert {c: dict(t) for c, t in accounted.items()} == truth(records)


def test_with_repartition_two_workers_killed_10_times_keep_every_total_exact(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    g = Group(kafka_service, redis_service, tmp_path, unique_name,
              "onceflow.examples.orders:build")
    g.start()
    records = orders(30_000, customers=300, seed=random.SystemRandom().randrange(10**6))
    rng = random.Random()

    async def produce_while_killing() -> dict[int, int]:
        producing = asyncio.create_task(
            harness.produce(g.bootstrap, g.topic, records, 40))
        await kill_in_turn(g.workers, 5, rng)  # 10 kills, 5 each, in a random order
        return await producing

    ends = asyncio.run(produce_while_killing())
    assert [w.kills for w in g.workers] == [5, 5]
    g.drained(g.topic, ends)
    hop_ends = asyncio.run(harness.read_ends(g.bootstrap, g.hop, PARTITIONS))
    assert sum(hop_ends.values()) >= len(records)  # re-sends after kills land there too
    g.drained(g.hop, hop_ends)
    store = g.store("orders")
    assert stored_states(store, "per_customer") == truth(records), f"logs: {g.logs()}"
    assert store.read_stats().get("per_customer.duplicates", 0) > 0  # replays were discarded
    assert asyncio.run(harness.read_all(g.bootstrap, g.dead, 1, quiet=1)) == []
    assert g.stop() == [0, 0]
