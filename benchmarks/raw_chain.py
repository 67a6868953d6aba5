"""The chaos topology written by hand, at least once: the chain's ceiling on this host.

Two processes, like ``onceflow chaos``'s ``normalize`` and ``windows``
(onceflow/examples/robot_chain.py), with none of the exactly-once work:

- **republisher**: getmany on the raw reports, ``json.loads`` each, produce
  one record per report to an intermediate topic (key: the serial; value:
  ``orjson.dumps`` of its ``[serial, ok, ts]`` results, what onceflow's unit
  carries without the envelope), sent as onceflow's producer sends: per
  partition (Kafka's default partitioner on the key), in as few ``send_batch``
  batches as hold them (until 2026-11-25, one ``send`` per record, which cost
  the process about 10 us per record more); a batch's offsets committed once
  its sends are acknowledged, in batch order, with up to four batches awaiting
  their acks.
- **aggregator**: getmany on the intermediate topic, ``orjson.loads`` each,
  fold ok/failed counts per robot per minute and per robot per day into
  in-memory dicts (window start = ts - ts % size), commit per batch.

What it leaves out, so it is a ceiling and not a rival: no dedup of re-sent
reports (nor of records re-sent after a crash: at least once), no lateness
or window closing, no state store, no transactions or fencing. Each child
prints JSON: wall time (``time.time()``) of its first and last record, its
record count, its CPU seconds (user + system, start-up included, like
the onceflow workers' figures), and its CPU seconds at its first and last
record (its steady state). The consumers use ``throughput.raw_child``'s
settings.

The envelope wire (``measure_chain(..., wire="envelope")``) keeps all of that
but speaks onceflow's wire and runs the example's own functions: the
per-record work any implementation of this chain must do, and no more.
- The republisher parses each report (orjson) and flat-maps it with
  ``robots.fastenings``. It writes one unit envelope per report, as onceflow's
  republish step does: a protobuf ``Envelope`` with key, payload type, a source
  chain of one ``SourceRef``, and one ``Item`` per fastening (index,
  ``encode_fastening`` payload, event id, event time), with the envelope format
  header. It sends them as on the JSON wire.
- The aggregator parses the envelope and reads the source reference and each
  item's index (what dedup would compare). It maps each item's payload with
  ``fastening_of`` and folds it with the example's ``count`` into the minute and
  the day window of its robot.

    python benchmarks/raw_chain.py republisher BOOTSTRAP INPUT OUTPUT EXPECTED [WIRE]
    python benchmarks/raw_chain.py aggregator BOOTSTRAP INPUT EXPECTED [WIRE]
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
from common import send_batches

from onceflow.examples.robot_chain import encode_fastening, fastening_of
from onceflow.examples.robots import count, fastenings, new_counts
from onceflow.kafka.producer import key_partition
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.formats import ENVELOPE_MARK
from onceflow.stages.lineage import event_id

MINUTE_MS = 60_000
DAY_MS = 86_400_000
TIMEOUT_S = 600.0
IN_FLIGHT = 4  # batches awaiting their acks and commit at once
WIRES = ("json", "envelope")
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


def envelope_unit(record: Any) -> tuple[bytes, bytes]:
    """A report as onceflow's republish step writes it: one unit envelope (the
    envelope wire); its key and value."""
    report = orjson.loads(record.value)
    serial = report["serial"]
    unit = Envelope(key=serial, payload_type="application/json")
    unit.source_chain.add(topic=record.topic, partition=record.partition,
                          offset=record.offset, index=0)
    root = (record.topic, record.partition)
    items = unit.items
    for j, fastening in enumerate(fastenings(report)):
        items.add(index=j, payload=encode_fastening(fastening),
                  event_id=event_id(root, (record.offset, j)), event_time_ms=fastening.ts)
    return serial.encode(), unit.SerializeToString()


async def republish(bootstrap: str, topic: str, output: str, expected: int,
                    wire: str = "json") -> dict[str, Any]:
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

    last = cpu_first = 0.0
    headers = [ENVELOPE_MARK] if wire == "envelope" else []
    partitions = sorted(await producer.partitions_for(output))
    try:
        while seen < expected:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            if not batches:
                continue
            if not first:
                first, cpu_first = time.time(), _cpu()
            sends = []
            lanes: dict[int, list[tuple[bytes, bytes]]] = {}  # partition -> (key, value)s
            for records in batches.values():
                for record in records:
                    if wire == "envelope":
                        key, value = envelope_unit(record)
                    else:
                        report = json.loads(record.value)
                        key = report["serial"].encode()
                        value = orjson.dumps([[report["serial"], bool(r["ok"]), r["ts"]]
                                              for r in report["results"]])
                    lanes.setdefault(key_partition(key, partitions), []).append((key, value))
                seen += len(records)
            for partition, outputs in lanes.items():
                sends.extend(await send_batches(producer, output, partition, outputs, headers))
            offsets = {tp: records[-1].offset + 1 for tp, records in batches.items()}
            settled.append(asyncio.ensure_future(
                settle(settled[-1] if settled else None, sends, offsets)))
            while len(settled) > IN_FLIGHT:
                await settled.popleft()
        while settled:
            last = await settled.popleft()
        cpu_last = _cpu()
    finally:
        await producer.stop()
        await consumer.stop()
    return {"records": seen, "first": first, "last": last, "cpu_first": cpu_first,
            "cpu_last": cpu_last}


def fold_envelope(value: bytes, minutes: dict[Any, Any], days: dict[Any, Any]) -> None:
    """A unit envelope folded on the envelope wire (the example's functions)."""
    unit = Envelope.FromString(value)
    source = unit.source_chain[0]
    _ = (source.topic, source.partition, source.offset)  # what dedup would compare
    for item in unit.items:
        _ = item.index
        fastening = fastening_of(item.payload)
        robot, ts = fastening.robot, fastening.ts  # the declared attrgetter key, event time
        for windows, size in ((minutes, MINUTE_MS), (days, DAY_MS)):
            at = (robot, ts - ts % size)
            windows[at] = count(windows.get(at) or new_counts(), fastening)


async def aggregate(bootstrap: str, topic: str, expected: int, wire: str = "json"
                    ) -> dict[str, Any]:
    """Per-robot minute and day ok/failed counts in dicts; commit per batch.

    ``last``: when the last record was folded (before that batch's commit),
    as onceflow's records counter counts a record once processed.
    """
    consumer = _consumer(bootstrap, topic)
    # (serial, window start): [ok, failed]
    minutes: defaultdict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    days: defaultdict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    # the envelope wire's: (robot, window start) -> the example's counts, minutes and days
    counts: tuple[dict[Any, Any], dict[Any, Any]] = {}, {}
    await consumer.start()
    seen, first, last, cpu_first, cpu_last = 0, 0.0, 0.0, 0.0, 0.0
    try:
        while seen < expected:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            if not batches:
                continue
            if not first:
                first, cpu_first = time.time(), _cpu()
            for records in batches.values():
                for record in records:
                    if wire == "envelope":
                        fold_envelope(record.value, *counts)
                        continue
                    for serial, ok, ts in orjson.loads(record.value):
                        at = 0 if ok else 1
                        minutes[serial, ts - ts % MINUTE_MS][at] += 1
                        days[serial, ts - ts % DAY_MS][at] += 1
                seen += len(records)
            last, cpu_last = time.time(), _cpu()
            await consumer.commit()
    finally:
        await consumer.stop()
    if wire == "envelope":
        events = sum(c["ok"] + c["failed"] for c in counts[1].values())
        windows = len(counts[0]), len(counts[1])
    else:
        events = sum(ok + failed for ok, failed in days.values())
        windows = len(minutes), len(days)
    return {"records": seen, "first": first, "last": last, "events": events,
            "minute_windows": windows[0], "day_windows": windows[1], "cpu_first": cpu_first,
            "cpu_last": cpu_last}


def child(argv: list[str]) -> None:
    role, bootstrap, *rest = argv
    if role == "republisher":
        topic, output, expected, *wire = rest
        result = asyncio.run(republish(bootstrap, topic, output, int(expected), *wire))
    else:
        topic, expected, *wire = rest
        result = asyncio.run(aggregate(bootstrap, topic, int(expected), *wire))
    print(json.dumps({**result, "cpu": _cpu()}))


def measure_chain(bootstrap: str, topic: str, intermediate: str,
                  expected: int, wire: str = "json") -> dict[str, dict[str, Any]]:
    """Both processes started together on an existing ``intermediate`` topic; their results
    (and ``started``: wall time just before they were spawned). ``wire``: see the module.

    Every input record yields one intermediate record, so the aggregator stops
    after ``expected`` records too.
    """
    assert wire in WIRES
    argvs = {"republisher": ["republisher", bootstrap, topic, intermediate, str(expected), wire],
             "aggregator": ["aggregator", bootstrap, intermediate, str(expected), wire]}
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
