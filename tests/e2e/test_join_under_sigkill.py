"""Payments joined with a merchants table that keeps changing category, totalled per
category, while two workers are SIGKILLed at random 10 times and the table is updated
throughout: every total is what the payments' first processing met, exactly once.

The truth is what each payment's first processing met, read two ways. From the merge
log: its runs, applied in their logged order to the payments and merchants topics as
they are in Kafka, give each payment the row it met first. From the outputs: the
enriched topic holds every emission of each payment (first run and replays re-send
them), and they must all carry that same category. Each category's total must be the
sum of the payments under it, and the totals over all categories the input's.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers import create_topic, stored_states
from recovery import kill_in_turn

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.kafka.merge_log_topic import decode_all, merge_log_topic
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stores.redis_store import RedisStore

PARTITIONS = 4
MERCHANTS = [f"m{i}" for i in range(40)]
CATEGORIES = ["food", "travel", "toys", "books", "fuel"]
HERE = str(Path(__file__).parent)


def test_payments_joined_with_changing_merchants_under_10_sigkills(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    rng = random.Random(random.SystemRandom().randrange(10**6))
    bootstrap = kafka_service.address
    pay, merch, out, hop = (unique_name("pay"), unique_name("merch"), unique_name("out"),
                            unique_name("hop"))
    pipeline_id, group, prefix = unique_name("j"), unique_name("g"), unique_name("p")
    for topic in (pay, merch, out):
        create_topic(bootstrap, topic, PARTITIONS)
    settings = {"onceflow.pipeline": "join_payments:pipeline",
                "onceflow.kafka.bootstrap-servers": bootstrap,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                "onceflow.stores.redis.key-prefix": prefix,
                "onceflow.commit.interval": "1s"}
    path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ONCEFLOW_JOIN_ID": pipeline_id,
           "ONCEFLOW_JOIN_PAYMENTS": pay, "ONCEFLOW_JOIN_MERCHANTS": merch,
           "ONCEFLOW_JOIN_OUTPUT": out, "ONCEFLOW_JOIN_HOP": hop}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    workers = [harness.WorkerProcess(argv, env, tmp_path, name) for name in "ab"]
    rows = [(m.encode(), json.dumps({"cat": rng.choice(CATEGORIES)}).encode())
            for m in MERCHANTS]
    updates = [(m.encode(), json.dumps({"cat": rng.choice(CATEGORIES)}).encode())
               for m in (rng.choice(MERCHANTS) for _ in range(600))]
    payments = []
    for i in range(6000):
        merchant = rng.choice(MERCHANTS)  # keyed by merchant: co-partitioned with its row
        payments.append((merchant.encode(), json.dumps(
            {"id": i, "merchant": merchant, "amount": rng.randint(1, 100)}).encode()))
    asyncio.run(harness.produce(bootstrap, merch, rows))
    try:
        for worker in workers:
            worker.start()

        async def produce_while_killing() -> dict[int, int]:
            paying = asyncio.create_task(harness.produce(bootstrap, pay, payments, 30))
            changing = asyncio.create_task(harness.produce(bootstrap, merch, updates, 30))
            await kill_in_turn(workers, 5, rng)  # 10 kills, 5 each, in a random order
            await changing
            return await paying

        ends = asyncio.run(produce_while_killing())
        assert [w.kills for w in workers] == [5, 5]

        async def drained(topic: str, want: dict[int, int]) -> bool:
            async with harness.CommittedOffsets(bootstrap, group) as committed:
                return await committed.wait_for(topic, want, 240)

        assert asyncio.run(drained(pay, ends)), [str(p) for w in workers for p in w.logs]
        hop_ends = asyncio.run(harness.read_ends(bootstrap, hop, PARTITIONS))
        assert asyncio.run(drained(hop, hop_ends)), [str(p) for w in workers for p in w.logs]
        emitted: dict[int, set[str]] = {}
        for record in asyncio.run(harness.read_all(bootstrap, out, PARTITIONS, quiet=1.0)):
            value = json.loads(Envelope.FromString(record.value or b"").payload)
            emitted.setdefault(value["id"], set()).add(str(value["cat"]))
        assert len(emitted) == len(payments)
        split = {i: cats for i, cats in emitted.items() if len(cats) > 1}
        assert split == {}, f"payments that met two versions of their row: {split}"
        logged = asyncio.run(categories_by_the_log(bootstrap, pipeline_id, pay, merch))
        assert len(logged) == len(payments)
        differ = {i: (cat, emitted[i]) for i, cat in logged.items() if {cat} != emitted[i]}
        assert differ == {}, f"emitted under another row than the logged order gives: {differ}"
        truth: dict[str, dict[str, int]] = {}
        for _, value in payments:
            payment = json.loads(value)
            category = logged[payment["id"]]
            total = truth.setdefault(category, {"n": 0, "amount": 0})
            total["n"] += 1
            total["amount"] += payment["amount"]
        store = RedisStore(f"redis://{redis_service.address}/0", prefix, pipeline_id)
        totals = stored_states(store, "totals")
        assert totals == truth, [str(p) for w in workers for p in w.logs]
        assert sum(t["amount"] for t in totals.values()) == sum(
            json.loads(v)["amount"] for _, v in payments)
        assert [w.terminate(20) for w in workers] == [0, 0]
    finally:
        for worker in workers:
            if worker.exited() is None:
                worker.kill()


async def categories_by_the_log(bootstrap: str, pipeline_id: str, payments: str,
                                merchants: str) -> dict[int, str]:
    """Each payment's category as the merge log orders it: per partition, the logged runs
    applied in order, a merchants run setting rows, a payments run reading them (the first
    run that covers an offset is the one its first processing applied)."""
    by_offset: dict[tuple[str, int], dict[int, tuple[str, Any]]] = {}
    for topic in (payments, merchants):
        for record in await harness.read_all(bootstrap, topic, PARTITIONS, quiet=1.0):
            by_offset.setdefault((topic, record.partition), {})[record.offset] = (
                (record.key or b"").decode(), json.loads(record.value or b""))
    log: dict[int, list[tuple[int, bytes]]] = {}
    for record in await harness.read_all(bootstrap, merge_log_topic(pipeline_id), PARTITIONS,
                                         quiet=1.0):
        log.setdefault(record.partition, []).append((record.offset, record.value or b""))
    found: dict[int, str] = {}
    for partition, records in log.items():
        rows: dict[str, str] = {}
        applied: dict[str, int] = {}  # topic -> the next offset not applied yet
        for run in decode_all(sorted(records)):
            values = by_offset.get((run.topic, partition), {})
            for offset in range(max(run.first, applied.get(run.topic, 0)), run.last + 1):
                key, value = values[offset]
                if run.topic == merchants:  # the table's row: its Kafka key, the latest value
                    rows[key] = str(value["cat"])
                else:
                    found[value["id"]] = str(rows.get(value["merchant"]))
            applied[run.topic] = max(applied.get(run.topic, 0), run.last + 1)
    return found
