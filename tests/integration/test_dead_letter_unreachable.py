"""A dead-letter topic the broker does not take: the record is not skipped.

The worker's sends to the dead-letter topic fail (fault injection, as an
unreachable leader or a refusing broker would): the dead letter goes to the
outbox, commits stop behind it, and /health says so (503, ``commits_held``; the log
too, once it has lasted 10 s),
while the valid records behind it are still folded and written (the test waits
until the stored states are exact with nothing committed past the dead letter).
A worker started without the fault delivers the dead letter and commits
everything; the totals are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers import stored_states

from onceflow.devtools import harness, services
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore


def health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_an_unreachable_dead_letter_topic_holds_commits_and_loses_nothing(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, dead_topic = unique_name("robots"), unique_name("dead")
    group, prefix = unique_name("g"), unique_name("p")
    for name in (topic, dead_topic):  # the broker takes it; only this worker cannot send
        asyncio.run(harness.create_topic(kafka_service.address, name, 1))
    redis_url = f"redis://{redis_service.address}/0"
    port = services.free_port()
    settings = {**redis_settings(kafka_service.address, redis_url, group, prefix),
                "onceflow.pipeline": "onceflow.examples.robots:pipeline",
                "onceflow.kafka.dead-letter-topic": dead_topic,
                "onceflow.kafka.producer.delivery-timeout": "1s",
                "onceflow.commit.interval": "200ms",
                "onceflow.metrics.stall-timeout": "1s",
                "onceflow.metrics.port": str(port)}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}
    cut_off = harness.WorkerProcess(argv, {**env, "ONCEFLOW_FAULT_PRODUCE_FAILS": dead_topic},
                                    tmp_path, "cut-off")
    reports = [json.dumps({"serial": f"r-{i % 7}", "seq": i // 7,
                           "results": [{"ok": i % 3 > 0, "ts": 0}]}).encode() for i in range(400)]
    truth: dict[str, Counter[str]] = {}
    for i in range(400):
        truth.setdefault(f"r-{i % 7}", Counter(ok=0, failed=0))["ok" if i % 3 else "failed"] += 1
    hostile = b"{not json"
    messages = [(None, r) for r in reports[:200]] + [(None, hostile)] + \
        [(None, r) for r in reports[200:]]

    cut_off.start()
    asyncio.run(cut_off.assigned())
    ends = asyncio.run(harness.produce(kafka_service.address, topic, messages))
    deadline, status, body = time.monotonic() + 60, 0, {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            status, body = health(port)
        if body.get("commits_held"):
            break
        time.sleep(0.2)
    log = cut_off.logs[-1]
    assert status == 503 and body["commits_held"] and body["outbox"] == 1, (body, log)
    assert "to the outbox, re-sent in order" in log.read_text(errors="replace"), log
    # The 200 valid records behind the stuck dead letter are folded and written to the
    # store, while nothing is committed past it (offset 200 is the hostile record).
    store = RedisStore(redis_url, prefix, "robots")
    try:
        folded = _wait_for_states(store, truth, cut_off, timeout=60)
    finally:
        store.close()
    assert folded == {r: dict(c) for r, c in truth.items()}, (folded, log)
    committed = asyncio.run(_committed(kafka_service.address, group, topic))
    assert committed <= 200, (committed, log)
    status, body = health(port)
    assert status == 503 and body["commits_held"] and body["outbox"] == 1, (body, log)
    assert body["consumer"]["fetch"]["max_in_flight"] > 0, body  # what holds fetching back
    # The log says it too, once the spell outlasts its grace (``HealthLog``: 10 s).
    deadline, told = time.monotonic() + 30, ""
    while time.monotonic() < deadline and "unhealthy for" not in told:
        time.sleep(0.5)
        told = log.read_text(errors="replace")
    line = next((x for x in told.splitlines() if "unhealthy for" in x), "")
    assert "commits held: 1 records wait in the outbox" in line, told[-3000:]
    assert "fetch loop: {'in_flight'" in line, line
    assert cut_off.terminate(15) == 0, log.read_text()[-3000:]
    assert asyncio.run(_committed(kafka_service.address, group, topic)) <= 200, log

    healed = harness.WorkerProcess(argv, env, tmp_path, "healed")
    healed.start()
    asyncio.run(_drained(kafka_service.address, group, topic, ends, healed))
    assert healed.terminate(15) == 0, healed.logs[-1].read_text()[-3000:]
    dead = asyncio.run(harness.read_all(kafka_service.address, dead_topic, 1, quiet=2))
    sources = {dict(r.headers)["onceflow.source"] for r in dead}
    assert sources == {f"{topic}/0/200".encode()}, dead  # replayed: it may come twice
    assert all(r.value == hostile for r in dead)
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert stored_states(store, "per_robot") == {r: dict(c) for r, c in truth.items()}
    finally:
        store.close()


def _wait_for_states(store: RedisStore, truth: dict[str, Counter[str]],
                     worker: harness.WorkerProcess, timeout: float) -> dict[str, Any]:
    """The stored per-robot states, once they equal ``truth`` (or at the timeout)."""
    want = {r: dict(c) for r, c in truth.items()}
    deadline = time.monotonic() + timeout
    while (states := stored_states(store, "per_robot")) != want \
            and time.monotonic() < deadline:
        assert worker.exited() is None, worker.log_tail()
        time.sleep(0.2)
    return states


async def _committed(bootstrap: str, group: str, topic: str) -> int:
    async with harness.CommittedOffsets(bootstrap, group) as offsets:
        return (await offsets.read(topic, [0]))[0]


async def _drained(bootstrap: str, group: str, topic: str, ends: dict[int, int],
                   worker: harness.WorkerProcess) -> None:
    async with harness.CommittedOffsets(bootstrap, group) as offsets:
        assert await offsets.wait_for(topic, ends, 90, worker), f"see {worker.logs[-1]}"
