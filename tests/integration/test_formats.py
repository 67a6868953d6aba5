"""A plain JSON topic on the real broker and Redis: metadata in user functions, exact totals,
and an envelope and a non-JSON value dead-lettered with their reasons, the worker running on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from helpers import committed, consume_all, create_topic, stored_states, wait_for_log

from onceflow.devtools import harness
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.services import ServiceInfo
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stores.redis_store import RedisStore

PIPELINE = '''
import os
from onceflow import Pipeline

def site_and_device(pair):
    value, meta = pair
    return {"slot": f"{meta.header('site').decode()}|{meta.key.decode()}",
            "v": value["v"], "ts": meta.timestamp_ms}

def add(state, reading):
    return {"n": state["n"] + 1, "sum": state["sum"] + reading["v"],
            "last_ts": max(state["last_ts"], reading["ts"])}

pipeline = (
    Pipeline("plain", topics=(os.environ["PLAIN_TOPIC"],), format="json", with_meta=True)
    .map("meta", site_and_device)
    .aggregate("per_slot", key=lambda r: r["slot"], init=lambda: {"n": 0, "sum": 0, "last_ts": 0},
               fold=add)
)
'''

Message = tuple[bytes, bytes, list[tuple[str, bytes]], int]  # key, value, headers, timestamp


def readings(start: int, count: int) -> list[Message]:
    return [(f"dev-{i % 7}".encode(), json.dumps({"v": i}).encode(),
             [("site", b"north" if i % 3 else b"south")], 1_700_000_000_000 + i)
            for i in range(start, start + count)]


def truth(messages: Sequence[Message]) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = {}
    for key, value, headers, ts in messages:
        slot = f"{dict(headers)['site'].decode()}|{key.decode()}"
        state = totals.setdefault(slot, {"n": 0, "sum": 0, "last_ts": 0})
        state.update(n=state["n"] + 1, sum=state["sum"] + json.loads(value)["v"],
                     last_ts=max(state["last_ts"], ts))
    return totals


def produce(bootstrap: str, topic: str, messages: Sequence[Message]) -> None:
    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                    enable_idempotence=False)
        await producer.start()
        try:
            for key, value, headers, ts in messages:
                await (await producer.send(topic, value, key=key, headers=headers,
                                           timestamp_ms=ts))
        finally:
            await producer.stop()

    asyncio.run(send())


def test_a_json_topic_with_metadata_totals_exact_and_bad_records_dead_lettered(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, group, prefix = unique_name("plain"), unique_name("g"), unique_name("p")
    dead = unique_name("dlq")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(kafka_service.address, topic, 2)
    create_topic(kafka_service.address, dead, 1)
    (tmp_path / "plain_pipeline.py").write_text(textwrap.dedent(PIPELINE))
    first = readings(0, 300)
    onceflow_record = Envelope(key="dev-1", payload=b'{"v": 1}').SerializeToString()
    bad: list[Message] = [
        (b"dev-1", onceflow_record, [("site", b"north"), ("onceflow-format", b"envelope")], 1),
        (b"dev-1", b"{not json", [("site", b"north")], 2),
    ]
    produce(kafka_service.address, topic, [*first[:100], *bad, *first[100:]])
    log = tmp_path / "worker.log"
    settings = {**redis_settings(kafka_service.address, redis_url, group, prefix),
                "onceflow.pipeline": "plain_pipeline:pipeline",
                "onceflow.kafka.dead-letter-topic": dead,
                "onceflow.metrics.stats-interval": "200ms"}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    env = {**os.environ, "PLAIN_TOPIC": topic,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    with log.open("wb") as out:
        worker = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_log(worker, log, "'records': 302", timeout=90)
        second = readings(300, 200)  # the worker runs on after the dead letters
        produce(kafka_service.address, topic, second)
        wait_for_log(worker, log, "'records': 502", timeout=60)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    text = log.read_text()
    letters = consume_all(kafka_service.address, dead, expected=2)
    assert sorted(r.value for r in letters) == sorted(m[1] for m in bad)
    reasons = {r.value: dict(r.headers)["onceflow.reason"].decode() for r in letters}
    assert reasons[onceflow_record] == (
        f"topic {topic!r} is declared json but holds onceflow envelopes (header "
        "onceflow-format=envelope): declare format='envelope' for it")
    assert reasons[b"{not json"].startswith(
        f"topic {topic!r} is declared json but the value does not parse: JSONDecodeError: ")
    assert "WARNING onceflow.actors.pipeline_actor: dead-lettered a record in stage 'source': " \
        f"topic {topic!r} is declared json but" in text, text[-3000:]
    store = RedisStore(redis_url, prefix, "plain")
    try:
        states: dict[str, Any] = stored_states(store, "per_slot")
    finally:
        store.close()
    assert states == truth([*first, *second])
    assert sum(committed(kafka_service.address, group, topic, 2).values()) == 502
