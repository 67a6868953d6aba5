"""The chaos topology written by hand, at least once: the chain's ceiling on this host.

Two processes, like ``onceflow chaos``'s ``normalize`` and ``windows``
(onceflow/examples/robot_chain.py), with none of the exactly-once work:

- **republisher**: getmany on the raw reports, ``json.loads`` each, produce
  one record per report to an intermediate topic (key: the serial; value:
  ``orjson.dumps`` of its ``[serial, ok, ts]`` results, what onceflow's unit
  carries without the envelope); a batch's offsets committed once its sends are
  acknowledged, in batch order, with up to four batches awaiting their acks.
- **aggregator**: getmany on the intermediate topic, ``orjson.loads`` each,
  fold ok/failed counts per robot per minute and per robot per day into
  in-memory dicts (window start = ts - ts % size), commit per batch.

What it leaves out, so it is a ceiling and not a rival: no dedup of re-sent
reports (nor of records re-sent after a crash: at least once), no lateness
or window closing, no state store, no transactions or fencing. Each child
prints JSON: wall time (``time.time()``) of its first and last record, its
record count, and its CPU seconds (user + system, start-up included, like
the onceflow workers' figures). The consumers use ``throughput.raw_child``'s
settings.

    python benchmarks/raw_chain.py republisher BOOTSTRAP INPUT OUTPUT EXPECTED
    python benchmarks/raw_chain.py aggregator BOOTSTRAP INPUT EXPECTED
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import defaultdict, deque
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

MINUTE_MS = 60_000
DAY_MS = 86_400_000
TIMEOUT_S = 600.0
IN_FLIGHT = 4  # batches awaiting their acks and commit at once
#: onceflow's default batch.size: aiokafka's 16 KB holds back a partition's sends while
#: its one open batch is on the wire
BATCH_BYTES = 1_048_576


def _consumer(bootstrap: str, topic: str) -> AIOKafkaConsumer:
    """``throughput.raw_child``'s consumer settings, a fresh group each run."""
    return AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                            group_id=f"raw-chain-{time.monotonic_ns()}",
                            auto_offset_reset="earliest", enable_auto_commit=False,
                            session_timeout_ms=6000, heartbeat_interval_ms=2000,
                            max_poll_records=2000)


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


async def republish(bootstrap: str, topic: str, output: str, expected: int) -> dict[str, Any]:
    """Each report as one record of its ``[serial, ok, ts]`` results; a batch's offsets
    committed once its sends are acknowledged and every earlier batch's are committed,
    up to ``IN_FLIGHT`` batches at once (so acks overlap the next batches' work, as a
    careful hand-written republisher would, and onceflow does).

    ``last``: when the batch holding the last record had its sends acknowledged.
    """
    consumer = _consumer(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                max_batch_size=BATCH_BYTES)
    await consumer.start()
    await producer.start()
    seen, first = 0, 0.0
    settled: deque[asyncio.Task[float]] = deque()

    async def settle(before: asyncio.Task[float] | None, sends: list[asyncio.Future[Any]],
                     offsets: dict[TopicPartition, int]) -> float:
        if before is not None:
            await before  # commits stay in order: never past an unacknowledged record
        await asyncio.gather(*sends)
        acked = time.time()
        await consumer.commit(offsets)
        return acked

    last = 0.0
    try:
        while seen < expected:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            if not batches:
                continue
            first = first or time.time()
            sends = []
            for records in batches.values():
                for record in records:
                    report = json.loads(record.value)
                    serial = report["serial"]
                    value = orjson.dumps([[serial, bool(r["ok"]), r["ts"]]
                                          for r in report["results"]])
                    sends.append(await producer.send(output, value, key=serial.encode()))
                seen += len(records)
            offsets = {tp: records[-1].offset + 1 for tp, records in batches.items()}
            settled.append(asyncio.ensure_future(
                settle(settled[-1] if settled else None, sends, offsets)))
            while len(settled) > IN_FLIGHT:
                await settled.popleft()
        while settled:
            last = await settled.popleft()
    finally:
        await producer.stop()
        await consumer.stop()
    return {"records": seen, "first": first, "last": last}


async def aggregate(bootstrap: str, topic: str, expected: int) -> dict[str, Any]:
    """Per-robot minute and day ok/failed counts in dicts; commit per batch.

    ``last``: when the last record was folded (before that batch's commit),
    as onceflow's records counter counts a record once processed.
    """
    consumer = _consumer(bootstrap, topic)
    # (serial, window start): [ok, failed]
    minutes: defaultdict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    days: defaultdict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    await consumer.start()
    seen, first, last = 0, 0.0, 0.0
    try:
        while seen < expected:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            if not batches:
                continue
            first = first or time.time()
            for records in batches.values():
                for record in records:
                    for serial, ok, ts in orjson.loads(record.value):
                        at = 0 if ok else 1
                        minutes[serial, ts - ts % MINUTE_MS][at] += 1
                        days[serial, ts - ts % DAY_MS][at] += 1
                seen += len(records)
            last = time.time()
            await consumer.commit()
    finally:
        await consumer.stop()
    events = sum(ok + failed for ok, failed in days.values())
    return {"records": seen, "first": first, "last": last, "events": events,
            "minute_windows": len(minutes), "day_windows": len(days)}


def child(argv: list[str]) -> None:
    role, bootstrap, *rest = argv
    if role == "republisher":
        topic, output, expected = rest
        result = asyncio.run(republish(bootstrap, topic, output, int(expected)))
    else:
        topic, expected = rest
        result = asyncio.run(aggregate(bootstrap, topic, int(expected)))
    print(json.dumps({**result, "cpu": _cpu()}))


def measure_chain(bootstrap: str, topic: str, intermediate: str,
                  expected: int) -> dict[str, dict[str, Any]]:
    """Both processes started together on an existing ``intermediate`` topic; their results
    (and ``started``: wall time just before they were spawned).

    Every input record yields one intermediate record, so the aggregator stops
    after ``expected`` records too.
    """
    argvs = {"republisher": ["republisher", bootstrap, topic, intermediate, str(expected)],
             "aggregator": ["aggregator", bootstrap, intermediate, str(expected)]}
    started = time.time()
    procs = {name: subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE)
             for name, argv in argvs.items()}
    results: dict[str, dict[str, Any]] = {"started": {"at": started}}
    try:
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            if proc.returncode != 0:
                raise RuntimeError(f"hand-written chain's {name} exited {proc.returncode}")
            results[name] = json.loads(out)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


if __name__ == "__main__":
    child(sys.argv[1:])
