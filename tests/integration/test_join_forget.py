"""``onceflow forget --topic <table topic>``: a join's table topic deleted and re-created.

The re-created topic's offsets start at 0, below what the old one left: the join's
table rows (versions at the old offsets, watermarks above the new records) and the
merge log's runs of the old topic (a replay would wait on them below the new
positions for ever). ``forget`` empties the rows and appends a forget record to the
merge log; the worker then enriches new payments with the new topic's rows, exactly
once. Both shapes of log: per co-partition (one partition, no single worker) and a
single worker's one order over two partitions (Kafka, Redis and the CLI for real).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_join_worker import MERCHANTS, payments, rows, total
from test_recreated_topic import _recreate

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.state import decode_state
from onceflow.stores.redis_store import RedisStore

HERE = str(Path(__file__).parent)


@pytest.mark.parametrize("partitions", [1, 2], ids=["co-partitioned", "single-worker"])
def test_forgetting_a_recreated_table_topic_clears_its_rows_and_merge_log_runs(
    partitions: int, kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    bootstrap = kafka_service.address
    pay, merch, out = unique_name("pay"), unique_name("merch"), unique_name("out")
    group, prefix, pipeline_id = unique_name("g"), unique_name("p"), unique_name("j")
    for topic in (pay, merch, out):
        asyncio.run(harness.create_topic(bootstrap, topic, partitions))
    settings = {"onceflow.pipeline": "join_pipeline:pipeline",
                "onceflow.kafka.bootstrap-servers": bootstrap,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                "onceflow.stores.redis.key-prefix": prefix,
                "onceflow.commit.interval": "300ms",
                "onceflow.persistence.interval": "200ms",
                # totals per category are fed from every partition: one worker, one order
                "onceflow.single-worker": "true" if partitions > 1 else "false"}
    path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ONCEFLOW_JOIN_ID": pipeline_id,
           "ONCEFLOW_JOIN_PAYMENTS": pay, "ONCEFLOW_JOIN_MERCHANTS": merch,
           "ONCEFLOW_JOIN_OUTPUT": out}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    store = RedisStore(f"redis://{redis_service.address}/0", prefix, pipeline_id)

    def drain(name: str, merch_ends: dict[int, int],
              messages: list[tuple[bytes | None, bytes]]) -> None:
        """A worker until the table's ends are committed, then ``messages`` are paid and
        committed too (the table first: each payment meets its row), then SIGTERM."""
        worker = harness.WorkerProcess(argv, env, tmp_path, name)
        worker.start()

        async def drained() -> bool:
            async with harness.CommittedOffsets(bootstrap, group) as offsets:
                if not await offsets.wait_for(merch, merch_ends, 60, worker):
                    return False
                ends = await harness.produce(bootstrap, pay, messages)
                return await offsets.wait_for(pay, ends, 60, worker)
        try:
            assert asyncio.run(drained()), worker.log_tail()
            assert worker.terminate(30) == 0, worker.log_tail()
        finally:
            if worker.exited() is None:
                worker.kill()

    try:
        first, later = payments(0, 40), payments(40, 40)
        old_rows = asyncio.run(harness.produce(bootstrap, merch, rows("A") + rows("A")))
        drain("old", old_rows, first)

        asyncio.run(_recreate(bootstrap, merch, partitions))  # offsets start over at 0
        new_rows = asyncio.run(harness.produce(bootstrap, merch, rows("B")))
        assert all(new_rows[p] < old_rows[p] for p in new_rows)  # below the old marks
        forget = [*argv[:argv.index("run")], "forget", *argv[argv.index("run") + 1:]]
        forgot = subprocess.run([*forget, "--topic", merch], capture_output=True, text=True,
                                env=env, timeout=120)
        assert forgot.returncode == 0, forgot.stderr[-3000:]
        summary = json.loads(forgot.stdout)
        assert summary["rows"]["redis/merchant"] == len(MERCHANTS), summary
        assert summary["merge_log_partitions"] == partitions, summary
        emptied = {key: decode_state(value) for key, value in store.scan("merchant")}
        assert {key: (state.value, state.watermarks) for key, state in emptied.items()} == {
            m: ([], {}) for m in MERCHANTS}

        started = time.monotonic()
        drain("new", new_rows, later)
        print(f"forget, {partitions} partition(s): drained the new topic in "
              f"{time.monotonic() - started:.1f}s; {summary}")
        seen: dict[int, set[str]] = {}
        for record in asyncio.run(harness.read_all(bootstrap, out, partitions, quiet=1.0)):
            value = json.loads(Envelope.FromString(record.value or b"").payload)
            seen.setdefault(value["id"], set()).add(str(value["cat"]))
        assert seen == {i: {"A" if i < 40 else "B"} for i in range(80)}
        totals = {key: decode_state(value).value for key, value in store.scan("totals")}
        assert totals == {"A": total(first), "B": total(later)}
        table = {key: decode_state(value) for key, value in store.scan("merchant")}
        for state in table.values():  # rows of the new topic, at its offsets
            assert state.value[-1][1] == {"cat": "B"}
            assert all(offset < new_rows[p] for (_, p), (offset,) in state.watermarks.items())
    finally:
        store.close()
