"""Offset holes and empty fetches, with a real broker and a real worker.

Tansu reserves a batch's offsets before it writes the batch, so a fetch that
lands in between returns the later batches without it: an offset hole. Without
the consumer's continuity check the worker moves past the missing batch and its
records are never counted (docs/guide/operations-and-health.md). The race is
rare and depends on load, so the hole test makes it deterministic: a proxy
(``hole_proxy.py``) removes one batch from a fetch response at each of three
offsets; the worker must re-fetch each hole and count every record, and with
the check off (gap-refetches = 0) it loses exactly the removed records.

Tansu also answers a fetch with no records once finding its offset takes longer
than the fetch's max wait (it walks the partition's batches): past ~100,000
records in 5-record batches a 20 ms wait brought nothing, and a tailing worker
stopped progressing, silently (issue 29). The worker now doubles its fetch max
wait when a partition's records wait and its fetches bring none: the far-behind
test starts there (a 1 ms wait, 20,000 records). The tailing test runs the load
that found both (8 producers of small batches, a CPU burner, a worker fetching
every 20 ms at the tail) for a fixed LOAD: every record counted, no hole
accepted, the worker reaches the total. The broker's own holes it meets
(re-fetches) are printed, not required: with the widened wait they became rare
(one re-fetch in each of 2 of 20 runs of 30-35 s, 26,800 to 67,605 records each,
on a 2-core host at load average 11-17), and that many records stay below where the 20 ms
wait stalled, so neither the hole nor the stall is what this test proves.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from helpers import create_topic, expected_counts, start_worker, stored_states, wait_for_log
from hole_proxy import HoleProxy, MarkerProxy
from prometheus_client.parser import text_string_to_metric_families

from onceflow.devtools import services
from onceflow.devtools.robot_stream import generate, parse_report
from onceflow.devtools.services import ServiceInfo, free_port
from onceflow.stores.redis_store import RedisStore

PRODUCERS = 8
BATCH = 5  # records per produce request (linger 0)
PAUSE = 0.005  # between one producer's requests
MOST = 12_000  # messages each producer sends at most (here at most 8,451 in LOAD)
ROBOTS = 200
FETCH_MAX_WAIT = "20ms"  # a fetch every 20 ms (Tansu always waits this long; 0 fetches nothing)
LOAD = 30.0  # seconds of load, from the moment every producer can send
# Tansu slows down as the partition grows, and a consumer that fell far behind
# may never catch up: the producers hold while the worker lags this much.
HOLD_LAG, RESUME_LAG = 2_000, 200

# One producer process: its own connection, small batches, until the stop file
# appears (waiting while the hold file exists); creates its ready file once it can
# send, and prints how many messages were acknowledged (a prefix of its
# deterministic stream).
PRODUCER = """
import asyncio, os, sys
from aiokafka import AIOKafkaProducer
from onceflow.devtools.robot_stream import generate

bootstrap, topic, seed, stop, hold, batch, pause, most, robots, ready = sys.argv[1:11]
messages = generate(int(most), robots=int(robots), seed=int(seed), fleet=f"r{seed}").messages

async def main():
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=0)
    await producer.start()
    open(ready, "w").close()
    sent = 0
    try:
        while sent < len(messages) and not os.path.exists(stop):
            if os.path.exists(hold):
                await asyncio.sleep(0.05)
                continue
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


def wait_ready(ready: list[Path], procs: list[subprocess.Popen[bytes]],
               worker: subprocess.Popen[bytes]) -> None:
    """Until every producer can send (generating its stream takes seconds under load):
    the load is measured from there."""
    deadline = time.monotonic() + 300
    while not all(path.exists() for path in ready):
        assert worker.poll() is None, "worker died"
        assert all(p.poll() is None for p in procs), "a producer died"
        assert time.monotonic() < deadline, "producers not ready after 300 s"
        time.sleep(0.2)


def load(port: int, worker: subprocess.Popen[bytes], hold: Path) -> None:
    """LOAD seconds of load, holding the producers while the worker lags (so it stays
    at the tail, where a fetch can meet the broker's race)."""
    start = time.monotonic()
    while time.monotonic() - start < LOAD:
        assert worker.poll() is None, "worker died"
        lag = scrape(port).get("onceflow_consumer_lag", 0.0)
        if lag > HOLD_LAG:
            hold.touch()
        elif lag < RESUME_LAG:
            hold.unlink(missing_ok=True)
        time.sleep(0.5)
    hold.unlink(missing_ok=True)


def wait_processed(port: int, total: int, worker: subprocess.Popen[bytes],
                   quiet: float = 15.0) -> float:
    """Records the worker processed, once it reached ``total`` or made no progress for
    ``quiet`` seconds."""
    seen, since = -1.0, time.monotonic()
    while time.monotonic() - since < quiet:
        assert worker.poll() is None, "worker died"
        now = scrape(port).get("onceflow_records_total", 0.0)
        if now >= total:
            return now
        if now != seen:
            seen, since = now, time.monotonic()
        time.sleep(0.5)
    return seen


def test_a_worker_tailing_a_busy_partition_under_cpu_load_counts_every_record(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """LOAD seconds of 8 producers and a CPU burner: the worker reaches the total
    (no stall), every record is counted and no hole is accepted."""
    bootstrap = kafka_service.address
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(bootstrap, topic, 1)
    port = free_port()
    log = tmp_path / "worker.log"
    stop, hold = tmp_path / "stop", tmp_path / "hold"
    worker = start_worker(bootstrap, redis_url, group, prefix, topic, log,
                          ["--set", f"onceflow.metrics.port={port}",
                           "--set", f"onceflow.kafka.fetch-max-wait={FETCH_MAX_WAIT}",
                           # /health's group-lag reader (two clients and a fetch from the
                           # committed offset each interval) is not what this test is about:
                           # read it once, not every 5 s on the two loaded cores
                           "--set", "onceflow.metrics.lag-interval=1h"])
    helpers: list[subprocess.Popen[bytes]] = []
    began = time.monotonic()
    try:
        hold.touch()  # the producers generate their streams while the worker joins
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        seeds = range(100, 100 + PRODUCERS)
        ready = [tmp_path / f"ready-{seed}" for seed in seeds]
        producers = [
            subprocess.Popen([sys.executable, "-c", PRODUCER, bootstrap, topic, str(seed),
                              str(stop), str(hold), str(BATCH), str(PAUSE), str(MOST),
                              str(ROBOTS), str(path)], stdout=subprocess.PIPE, env=env)
            for seed, path in zip(seeds, ready, strict=True)]
        helpers += producers
        wait_for_log(worker, log, "partitions assigned", timeout=60)
        marks = {"assigned": time.monotonic() - began}
        wait_ready(ready, producers, worker)
        marks["ready"] = time.monotonic() - began
        # started once the producers have generated their streams: it slowed that down
        burner = subprocess.Popen([sys.executable, "-c", BURN, str(LOAD + 90)])
        helpers.append(burner)
        load(port, worker, hold)
        stop.touch()
        sent = {seed: int(p.communicate(timeout=60)[0])
                for seed, p in zip(seeds, producers, strict=True)}
        burner.kill()
        total = sum(sent.values())
        processed = wait_processed(port, total, worker)
        marks["processed"] = time.monotonic() - began
        series = scrape(port)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
        marks["exited"] = time.monotonic() - began
    finally:
        for proc in [worker, *helpers]:
            if proc.poll() is None:
                proc.kill()
    refetches = series.get("onceflow_offset_refetches_total", 0.0)
    accepted = series.get("onceflow_offset_gaps_accepted_total", 0.0)
    print(f"{LOAD:.0f} s of load: produced {total} by {PRODUCERS} producers, "
          f"processed {processed}, re-fetches {refetches}, holes accepted {accepted}; "
          + ", ".join(f"{name} at {at:.0f} s" for name, at in marks.items()))
    assert code == 0, log.read_text()[-3000:]
    assert processed == total, log.read_text()[-3000:]  # short: the worker stalled
    truths = [generate(count, robots=ROBOTS, seed=seed, fleet=f"r{seed}").truth
              for seed, count in sent.items()]
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert stored_states(store, "per_robot") == expected_counts(*truths)
    finally:
        store.close()
    assert accepted == 0


FAR_RECORDS = 20_000  # in 5-record batches: 4,000 batches, ~12 ms of Tansu lookup here
FAR_FETCH_MAX_WAIT = "1ms"  # far below that lookup on any host


async def fill(bootstrap: str, topic: str,
               streams: list[list[tuple[bytes, bytes]]]) -> None:
    """Append each stream in order, in BATCH-record batches (one request each), all
    streams at once, each from its own producer (as the tailing test's producers)."""

    async def lane(messages: list[tuple[bytes, bytes]]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                    enable_idempotence=False, linger_ms=0)
        await producer.start()
        try:
            for i in range(0, len(messages), BATCH):
                batch = producer.create_batch()
                for key, value in messages[i:i + BATCH]:
                    batch.append(key=key, value=value, timestamp=None)
                batch.close()
                await (await producer.send_batch(batch, topic, partition=0))
        finally:
            await producer.stop()

    await asyncio.gather(*(lane(messages) for messages in streams))


def test_a_worker_far_behind_widens_a_fetch_that_brings_nothing_and_counts_every_record(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """A fetch max wait shorter than Tansu's lookup brought no record, for ever (the
    stall of issue 29, here from the start): the worker says so and widens it."""
    bootstrap = kafka_service.address
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(bootstrap, topic, 1)
    streams = [generate(FAR_RECORDS // PRODUCERS, robots=ROBOTS, seed=seed, fleet=f"f{seed}")
               for seed in range(PRODUCERS)]  # a fleet each: one robot, one producer
    asyncio.run(fill(bootstrap, topic, [stream.messages for stream in streams]))
    total = sum(len(stream.messages) for stream in streams)
    port = free_port()
    log = tmp_path / "worker.log"
    worker = start_worker(bootstrap, redis_url, group, prefix, topic, log,
                          ["--set", f"onceflow.metrics.port={port}",
                           "--set", f"onceflow.kafka.fetch-max-wait={FAR_FETCH_MAX_WAIT}",
                           # a stall (once in CI: 5 records short, silent) is logged with
                           # the fetch loop's state 10 s + HealthLog's grace into it
                           "--set", "onceflow.metrics.stall-timeout=10s"])
    try:
        wait_for_log(worker, log, "partitions assigned", timeout=60)
        # Each doubling of the max wait follows 2 s of fetches bringing nothing.
        processed = wait_processed(port, total, worker, quiet=40)
        series = scrape(port)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert processed == total, text[-3000:]
    assert series.get("onceflow_fetch_starved_total", 0.0) > 0
    assert "brought no records" in text
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert stored_states(store, "per_robot") == expected_counts(
            *(stream.truth for stream in streams))
    finally:
        store.close()


HOLE_RECORDS = 3_000  # one producer, BATCH-record batches: offset i is message i
HOLES = (600, 1_500, 2_400)  # a batch at or after each is removed from a fetch response
HOLE_FETCH_MAX_WAIT_MS = 250  # the worker's consumer; its group-less readers use 100 ms


def kept_counts(messages: list[tuple[bytes, bytes]], removed: list[tuple[int, int]]
                ) -> dict[str, dict[str, int]]:
    """The per-robot states of ``messages`` without the removed batches' records."""
    lost = {offset for base, count in removed for offset in range(base, base + count)}
    counts: dict[str, Counter[str]] = {}
    for offset, (_, value) in enumerate(messages):
        if offset not in lost:
            report = parse_report(value)
            tally = counts.setdefault(report["serial"], Counter())
            tally.update("ok" if r["ok"] else "failed" for r in report["results"])
    return expected_counts(counts)


@pytest.mark.parametrize("refetches", [5, 0], ids=["checked", "unchecked"])
def test_a_hole_in_a_fetch_response_is_refetched_and_every_record_counted(
    redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
    refetches: int,
) -> None:
    """The broker's race, made deterministic: a proxy removes one batch from the middle
    of a fetch response at each of HOLES. The consumer's continuity check re-fetches each
    hole and counts every record; unchecked (gap-refetches = 0) it accepts each hole and
    the removed batches' records are lost, exactly those."""
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    proxy_port = free_port()
    kafka = services.start_tansu(tmp_path / "kafka", advertised_port=proxy_port)
    proxy = HoleProxy(proxy_port, kafka.port, topic, 0, HOLES,
                      max_wait_ms=HOLE_FETCH_MAX_WAIT_MS)
    bootstrap = f"127.0.0.1:{proxy_port}"
    redis_url = f"redis://{redis_service.address}/0"
    port = free_port()
    log = tmp_path / "worker.log"
    worker: subprocess.Popen[bytes] | None = None
    try:
        create_topic(bootstrap, topic, 1)
        stream = generate(HOLE_RECORDS, robots=ROBOTS, seed=7, fleet="h")
        asyncio.run(fill(bootstrap, topic, [stream.messages]))
        worker = start_worker(
            bootstrap, redis_url, group, prefix, topic, log,
            ["--set", f"onceflow.metrics.port={port}",
             "--set", f"onceflow.kafka.fetch-max-wait={HOLE_FETCH_MAX_WAIT_MS}ms",
             "--set", f"onceflow.consumer.gap-refetches={refetches}"])
        wait_for_log(worker, log, "partitions assigned", timeout=60)
        expected = HOLE_RECORDS - BATCH * len(HOLES) if refetches == 0 else HOLE_RECORDS
        processed = wait_processed(port, expected, worker)
        series = scrape(port)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        proxy.close()
        services.stop(kafka)
    text = log.read_text()
    refetched = series.get("onceflow_offset_refetches_total", 0.0)
    accepted = series.get("onceflow_offset_gaps_accepted_total", 0.0)
    print(f"Fetch v{sorted(proxy.versions)}: removed {proxy.removed}, processed {processed} "
          f"of {HOLE_RECORDS}, re-fetches {refetched}, holes accepted {accepted}")
    assert proxy.errors == []
    assert code == 0, text[-3000:]
    assert proxy.pending == [] and len(proxy.removed) == len(HOLES)
    assert all(count == BATCH for _, count in proxy.removed)
    assert processed == expected, text[-3000:]
    store = RedisStore(redis_url, prefix, "robots")
    try:
        states = stored_states(store, "per_robot")
    finally:
        store.close()
    if refetches:
        assert refetched >= len(HOLES)
        assert accepted == 0
        assert states == expected_counts(stream.truth)
    else:
        assert refetched == 0
        assert accepted == len(HOLES)
        assert states == kept_counts(stream.messages, proxy.removed)
        assert states != expected_counts(stream.truth)


MARKED_BATCHES = 300  # BATCH-record batches of robot reports
MARKERS_AFTER = (60, 150, 240)  # a commit marker after these many batches


async def fill_with_markers(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]
                            ) -> list[int]:
    """``messages`` in BATCH-record batches, with a one-record batch after each of
    MARKERS_AFTER (served as a commit marker by the proxy); returns their offsets."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=0)
    await producer.start()
    markers: list[int] = []
    try:
        for n, i in enumerate(range(0, len(messages), BATCH), start=1):
            batch = producer.create_batch()
            for key, value in messages[i:i + BATCH]:
                batch.append(key=key, value=value, timestamp=None)
            batch.close()
            meta = await (await producer.send_batch(batch, topic, partition=0))
            if n in MARKERS_AFTER:
                placeholder = await producer.send_and_wait(topic, b"marker", partition=0)
                assert placeholder.offset == meta.offset + BATCH  # dense, one producer
                markers.append(placeholder.offset)
    finally:
        await producer.stop()
    return markers


def test_a_transaction_marker_is_no_hole_to_refetch(
    redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    """A commit marker takes an offset the consumer never returns: aiokafka skips the
    control batch. The worker passes it without a re-fetch or an accepted hole, and
    counts every record (each marker cost gap-refetches re-fetches and a WARNING)."""
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    stream = generate(MARKED_BATCHES * BATCH, robots=ROBOTS, seed=11, fleet="m")
    proxy_port = free_port()
    kafka = services.start_tansu(tmp_path / "kafka", advertised_port=proxy_port)
    proxy: MarkerProxy | None = None
    bootstrap = f"127.0.0.1:{proxy_port}"
    redis_url = f"redis://{redis_service.address}/0"
    port = free_port()
    log = tmp_path / "worker.log"
    worker: subprocess.Popen[bytes] | None = None
    try:
        markers = [b * BATCH + k for k, b in enumerate(MARKERS_AFTER)]  # fill checks them
        proxy = MarkerProxy(proxy_port, kafka.port, topic, 0, markers)
        create_topic(bootstrap, topic, 1)
        assert asyncio.run(fill_with_markers(bootstrap, topic, stream.messages)) == markers
        worker = start_worker(bootstrap, redis_url, group, prefix, topic, log,
                              ["--set", f"onceflow.metrics.port={port}"])
        wait_for_log(worker, log, "partitions assigned", timeout=60)
        processed = wait_processed(port, len(stream.messages), worker)
        series = scrape(port)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        if proxy is not None:
            proxy.close()
        services.stop(kafka)
    text = log.read_text()
    refetched = series.get("onceflow_offset_refetches_total", 0.0)
    accepted = series.get("onceflow_offset_gaps_accepted_total", 0.0)
    print(f"markers at {markers}, served as markers {proxy.replaced} times, processed "
          f"{processed}, re-fetches {refetched}, holes accepted {accepted}")
    assert proxy.errors == [] and proxy.replaced >= len(markers)
    assert code == 0, text[-3000:]
    assert processed == len(stream.messages), text[-3000:]
    assert (refetched, accepted) == (0, 0), text[-3000:]
    assert "missing after every re-fetch" not in text
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert stored_states(store, "per_robot") == expected_counts(stream.truth)
    finally:
        store.close()
