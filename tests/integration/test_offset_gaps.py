"""A worker tailing a partition that several producers append to, under CPU load.

Tansu reserves a batch's offsets before it writes the batch, so a fetch that
lands in between returns the later batches without it. Without the
consumer's continuity check the worker moves past the missing batch and its
records are never counted (seen by hand with gap-refetches = 0: see README).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from helpers import create_topic, expected_counts, start_worker, stored_states, wait_for_log
from prometheus_client.parser import text_string_to_metric_families

from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo, free_port
from onceflow.stores.redis_store import RedisStore

PRODUCERS = 8
SECONDS = 40.0
BATCH = 5  # records per produce request (linger 0)
PAUSE = 0.002  # between one producer's requests
MOST = 100_000  # messages each producer can send at most
ROBOTS = 200

# One producer process: its own connection, small batches, for SECONDS; prints how
# many messages were acknowledged (a prefix of its deterministic stream).
PRODUCER = """
import asyncio, sys, time
from aiokafka import AIOKafkaProducer
from onceflow.devtools.robot_stream import generate

bootstrap, topic, seed, seconds, batch, pause, most, robots = sys.argv[1:9]
messages = generate(int(most), robots=int(robots), seed=int(seed)).messages

async def main():
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=0)
    await producer.start()
    sent, end = 0, time.monotonic() + float(seconds)
    try:
        while sent < len(messages) and time.monotonic() < end:
            acks = [await producer.send(topic, value, key=key)
                    for key, value in messages[sent:sent + int(batch)]]
            await asyncio.gather(*acks)
            sent += len(acks)
            await asyncio.sleep(float(pause))
    finally:
        await producer.stop()
    print(sent)

asyncio.run(main())
"""
BURN = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\n" \
       "while time.monotonic() < end:\n    pass\n"


def scrape(port: int) -> dict[str, float]:
    """The worker's /metrics samples, summed over labels: name -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def wait_processed(port: int, total: int, worker: subprocess.Popen[bytes]) -> float:
    """Records the worker processed, once it reached ``total`` or stopped progressing."""
    seen, since = -1.0, time.monotonic()
    while time.monotonic() - since < 15:
        assert worker.poll() is None, "worker died"
        now = scrape(port).get("onceflow_records_total", 0.0)
        if now >= total:
            return now
        if now != seen:
            seen, since = now, time.monotonic()
        time.sleep(0.5)
    return seen


def test_tailing_worker_under_cpu_load_refetches_holes_and_counts_every_record(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    bootstrap = kafka_service.address
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(bootstrap, topic, 1)
    port = free_port()
    log = tmp_path / "worker.log"
    worker = start_worker(bootstrap, redis_url, group, prefix, topic, log,
                          ["--set", f"onceflow.metrics.port={port}"])
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        wait_for_log(worker, log, "partitions assigned", timeout=60)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        helpers.append(subprocess.Popen([sys.executable, "-c", BURN, str(SECONDS + 5)]))
        producers = [
            subprocess.Popen([sys.executable, "-c", PRODUCER, bootstrap, topic, str(seed),
                              str(SECONDS), str(BATCH), str(PAUSE), str(MOST), str(ROBOTS)],
                             stdout=subprocess.PIPE, env=env)
            for seed in range(100, 100 + PRODUCERS)]
        helpers += producers
        sent = {seed: int(p.communicate(timeout=SECONDS + 60)[0])
                for seed, p in zip(range(100, 100 + PRODUCERS), producers, strict=True)}
        total = sum(sent.values())
        processed = wait_processed(port, total, worker)
        series = scrape(port)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    finally:
        for proc in [worker, *helpers]:
            if proc.poll() is None:
                proc.kill()
    refetches = series.get("onceflow_offset_refetches_total", 0.0)
    accepted = series.get("onceflow_offset_gaps_accepted_total", 0.0)
    print(f"produced {total} by {PRODUCERS} producers, processed {processed}, "
          f"re-fetches {refetches}, holes accepted {accepted}")
    assert code == 0, log.read_text()[-3000:]
    assert processed == total
    truths = [generate(count, robots=ROBOTS, seed=seed).truth for seed, count in sent.items()]
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert stored_states(store, "per_robot") == expected_counts(*truths)
    finally:
        store.close()
    assert accepted == 0
    assert refetches > 0  # the hole really happened (else the load found nothing to test)

