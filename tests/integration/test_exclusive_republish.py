"""Exclusive republish on the real broker and Redis: a killed worker's successor writes
each output once; plain JSON outputs read by a plain consumer."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, ConsumerRecord

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.protos.envelope_pb2 import Envelope

PARTITIONS = 2


def items(n: int) -> list[tuple[bytes | None, bytes]]:
    """``n`` JSON items with 1-5 parts each, keyed over the partitions."""
    return [(f"k{i}".encode(), json.dumps({"id": i, "parts": 1 + i * 7 % 5}).encode())
            for i in range(n)]


def worker(kafka: ServiceInfo, redis: ServiceInfo, tmp_path: Path, name: str, group: str,
           prefix: str, topics: dict[str, str], pipeline: str = "onceflow.examples.mirror:mirror",
           env: dict[str, str] | None = None, commit: str = "2s",
           extra: dict[str, str] | None = None) -> harness.WorkerProcess:
    settings = {**(extra or {}), "onceflow.pipeline": pipeline,
                "onceflow.kafka.bootstrap-servers": kafka.address,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": f"redis://{redis.address}/0",
                "onceflow.stores.redis.key-prefix": prefix,
                "onceflow.commit.interval": commit}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    process = harness.WorkerProcess(argv, {**os.environ, **topics, **(env or {})}, tmp_path, name)
    process.start()
    return process


def expected_parts(inputs: list[ConsumerRecord[bytes, bytes]]) -> dict[int, list[tuple[int, int]]]:
    """Per output partition (= input partition): every (id, part), in input order."""
    want: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    for record in sorted(inputs, key=lambda r: (r.partition, r.offset)):
        item = json.loads(record.value or b"")
        want[record.partition] += [(item["id"], j) for j in range(item["parts"])]
    return want


def written_parts(outputs: list[ConsumerRecord[bytes, bytes]], plain: bool = False
                  ) -> dict[int, list[tuple[int, int]]]:
    got: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    for record in sorted(outputs, key=lambda r: (r.partition, r.offset)):
        value = record.value if plain else Envelope.FromString(record.value or b"").payload
        part = json.loads(value or b"")
        got[record.partition].append((part["id"], part["part"]))
    return got


def setup(kafka: ServiceInfo, unique_name: Callable[..., str], n: int
          ) -> tuple[dict[str, str], dict[int, int], list[ConsumerRecord[bytes, bytes]]]:
    source, output = unique_name("in"), unique_name("out")
    for topic in (source, output):
        asyncio.run(harness.create_topic(kafka.address, topic, PARTITIONS))
    ends = asyncio.run(harness.produce(kafka.address, source, items(n)))
    inputs = asyncio.run(harness.read_all(kafka.address, source, PARTITIONS, quiet=1.0))
    assert len(inputs) == n
    return {"ONCEFLOW_MIRROR_TOPIC": source, "ONCEFLOW_MIRROR_OUTPUT": output}, ends, inputs


def wait_killed(process: harness.WorkerProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while process.exited() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.exited() == -9, f"expected a SIGKILL; see {process.logs[-1]}"


async def drained(kafka: ServiceInfo, group: str, topic: str, ends: dict[int, int],
                  process: harness.WorkerProcess) -> None:
    async with harness.CommittedOffsets(kafka.address, group) as committed:
        assert await committed.wait_for(topic, ends, 90, process), f"see {process.logs[-1]}"


def test_a_restarted_exclusive_republisher_writes_each_output_once_in_order(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topics, ends, inputs = setup(kafka_service, unique_name, 600)
    want = expected_parts(inputs)
    total = sum(map(len, want.values()))
    group, prefix = unique_name("g"), unique_name("p")
    # Outputs are sent, the input offsets never committed: the successor replays
    # every input from offset 0, and must skip everything already written.
    cut = total // 2 + 1
    dying = worker(kafka_service, redis_service, tmp_path, "dying", group, prefix, topics,
                   env={"ONCEFLOW_FAULT_KILL_AFTER_SENDS": str(cut)}, commit="1h")
    wait_killed(dying)
    output = topics["ONCEFLOW_MIRROR_OUTPUT"]
    before = asyncio.run(harness.read_all(kafka_service.address, output, PARTITIONS, quiet=1.0))
    assert len(before) >= cut  # the kill really left outputs behind
    successor = worker(kafka_service, redis_service, tmp_path, "successor", group, prefix,
                       topics)
    asyncio.run(drained(kafka_service, group, topics["ONCEFLOW_MIRROR_TOPIC"], ends, successor))
    assert successor.terminate(10) == 0
    log = successor.logs[-1].read_text()
    assert "skip up to {(" in log  # the successor found outputs of the replayed inputs
    outputs = asyncio.run(harness.read_all(kafka_service.address, output, PARTITIONS, quiet=1.0))
    assert written_parts(outputs) == want  # each part once, in order, nothing missing
    assert len(outputs) == total


def test_outputs_parked_in_the_outbox_count_as_written_and_are_sent_once(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topics, ends, inputs = setup(kafka_service, unique_name, 200)
    want = expected_parts(inputs)
    group, prefix = unique_name("g"), unique_name("p")
    output = topics["ONCEFLOW_MIRROR_OUTPUT"]
    # Every send to the output fails: after the delivery timeout all outputs go to the
    # outbox (Redis, chosen: a stateless pipeline has none by default), the inputs stay
    # uncommitted, and the worker is SIGKILLed.
    outbox = {"onceflow.kafka.producer.outbox-store": "redis"}
    parking = worker(kafka_service, redis_service, tmp_path, "parking", group, prefix, topics,
                     env={"ONCEFLOW_FAULT_PRODUCE_FAILS": output},
                     extra={**outbox, "onceflow.kafka.producer.delivery-timeout": "1s"})
    log = parking.logs[-1]
    deadline = time.monotonic() + 60
    while "to the outbox" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "to the outbox" in log.read_text(), f"see {log}"
    time.sleep(1.0)  # the outbox writer stores the rows
    parking.kill()
    # The successor adopts the rows (re-sent first), counts them as written, and
    # replays every input from offset 0 without writing any output again.
    successor = worker(kafka_service, redis_service, tmp_path, "successor", group, prefix,
                       topics, extra=outbox)
    asyncio.run(drained(kafka_service, group, topics["ONCEFLOW_MIRROR_TOPIC"], ends, successor))
    assert successor.terminate(10) == 0
    text = successor.logs[-1].read_text()
    assert "adopted" in text and "skip up to {(" in text, f"see {successor.logs[-1]}"
    outputs = asyncio.run(harness.read_all(kafka_service.address, output, PARTITIONS, quiet=1.0))
    assert written_parts(outputs) == want


def test_plain_json_outputs_are_ordinary_records_with_their_origin_in_headers(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topics, ends, inputs = setup(kafka_service, unique_name, 50)
    group, prefix = unique_name("g"), unique_name("p")
    process = worker(kafka_service, redis_service, tmp_path, "plain", group, prefix, topics,
                     "onceflow.examples.mirror:mirror_plain")
    asyncio.run(drained(kafka_service, group, topics["ONCEFLOW_MIRROR_TOPIC"], ends, process))
    assert process.terminate(10) == 0

    async def read() -> list[ConsumerRecord[bytes, bytes]]:  # a consumer that knows no onceflow
        consumer = AIOKafkaConsumer(topics["ONCEFLOW_MIRROR_OUTPUT"],
                                    bootstrap_servers=kafka_service.address,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        found: list[ConsumerRecord[bytes, bytes]] = []
        try:
            want = sum(map(len, expected_parts(inputs).values()))
            deadline = time.monotonic() + 30
            while len(found) < want and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    found += records
        finally:
            await consumer.stop()
        return found

    outputs = asyncio.run(read())
    assert written_parts(outputs, plain=True) == expected_parts(inputs)
    by_input = {(r.partition, json.loads(r.value or b"")["id"]): r for r in inputs}
    for record in outputs:
        value = json.loads(record.value or b"")
        headers = {name: raw.decode() for name, raw in record.headers}
        source = by_input[(record.partition, value["id"])]
        assert record.key == f"{value['id']}".encode()
        assert headers["onceflow-format"] == "json"
        assert headers["onceflow-origin-topic"] == topics["ONCEFLOW_MIRROR_TOPIC"]
        assert int(headers["onceflow-origin-partition"]) == source.partition
        assert int(headers["onceflow-origin-offset"]) == source.offset
        assert int(headers["onceflow-origin-index"]) == value["part"]
        assert headers["onceflow-chain"] == (f"{source.topic}/{source.partition}/"
                                             f"{source.offset}/{value['part']}")
