"""A single worker's merge log gets a known position for every partition of a fresh group.

``JoinRunner.start`` refuses a position it is not told (-1: ``NotCoAssigned``, "no known
position"), since the replay starts at the first logged run not below it. The consumer
answers -1 only when ``position()`` times out or fails; a fresh group (no committed
offset) resolves through ``auto-offset-reset``, ``latest`` too (the re-created topic of
``test_join_forget`` resolves through ``earliest``). Here a single worker (aggregates
over two partitions, a join) starts on a fresh group with ``latest`` over topics that
already hold records: it starts without refusing a position, and enriches what comes
after it started. (Where ``latest`` puts it is the broker's ListOffsets answer, which
Tansu gets wrong for multi-record batches: here some earlier payments are enriched too.)
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from test_join_worker import payments, rows

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.protos.envelope_pb2 import Envelope

PARTITIONS = 2
HERE = str(Path(__file__).parent)


def test_a_fresh_group_reading_from_latest_starts_a_single_workers_merge_log(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    bootstrap = kafka_service.address
    pay, merch, out = unique_name("pay"), unique_name("merch"), unique_name("out")
    for topic in (pay, merch, out):
        asyncio.run(harness.create_topic(bootstrap, topic, PARTITIONS))
    asyncio.run(harness.produce(bootstrap, merch, rows("A")))
    asyncio.run(harness.produce(bootstrap, pay, payments(0, 20)))  # before the group
    settings = {"onceflow.pipeline": "join_pipeline:pipeline",
                "onceflow.kafka.bootstrap-servers": bootstrap,
                "onceflow.kafka.group-id": unique_name("g"),
                "onceflow.kafka.auto-offset-reset": "latest",
                "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                "onceflow.stores.redis.key-prefix": unique_name("p"),
                "onceflow.commit.interval": "300ms",
                "onceflow.single-worker": "true"}
    path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ONCEFLOW_JOIN_ID": unique_name("j"),
           "ONCEFLOW_JOIN_PAYMENTS": pay, "ONCEFLOW_JOIN_MERCHANTS": merch,
           "ONCEFLOW_JOIN_OUTPUT": out}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings), env,
        tmp_path, "latest")
    worker.start()
    try:
        asyncio.run(worker.assigned(90))

        async def enriched_after_start() -> set[int]:
            """Pay one more payment every 0.3 s until one is enriched (one paid before the
            positions were learned may be skipped, as ``latest`` says)."""
            deadline, next_id = time.monotonic() + 60, 20
            while time.monotonic() < deadline:
                await harness.produce(bootstrap, pay, payments(next_id, 1))
                next_id += 1
                found = await harness.read_all(bootstrap, out, PARTITIONS, quiet=0.3)
                if found:
                    return {json.loads(Envelope.FromString(r.value or b"").payload)["id"]
                            for r in found}
                assert worker.exited() is None, worker.log_tail()
            raise AssertionError(f"nothing enriched in 60 s: {worker.log_tail()}")

        ids = asyncio.run(enriched_after_start())
        assert ids, worker.log_tail()
        print(f"latest on a fresh group: enriched payments from id {min(ids)} (of 0..)")
        text = worker.logs[-1].read_text(errors="replace")
        assert "no known position" not in text and "NotCoAssigned" not in text, text[-3000:]
        assert worker.terminate(30) == 0, worker.log_tail()
    finally:
        if worker.exited() is None:
            worker.kill()
