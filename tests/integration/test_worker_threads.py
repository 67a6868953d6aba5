"""The worker's long-lived threads, counted once it runs, so the count cannot grow unseen.

docs/architecture.md, section 3: the Kafka clients, the tickers and the commits
live on one event loop; a batch crosses few threads. A new thread per actor or
per ticker would show here first.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from helpers import committed, create_topic, produce

from onceflow.devtools import harness
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.examples import robots
from onceflow.runtime.config import load_settings
from onceflow.runtime.worker import Worker

#: The worker's own threads once running, without the metrics port: the main thread
#: (waits for a stop), the supervisor, the event loop (Kafka clients, timers, the checkpoint
#: coordinator), the pipeline actor (the runner and its states) and persistence (store
#: writes). Before issue 30 there were 11 (a thread per actor and per ticker).
MAX_THREADS = 5
#: Pool threads the loop borrows for blocking store calls at an assignment (epochs, log
#: marks, outbox); bounded by the pool, counted apart.
POOL = "asyncio_"


def test_a_running_worker_has_at_most_five_long_lived_threads(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, unique_name: Callable[..., str],
) -> None:
    robots_topic = unique_name("robots")
    create_topic(kafka_service.address, robots_topic, 2)
    ends = produce(kafka_service.address, robots_topic, generate(500, seed=4).messages)
    group = unique_name("g")
    overrides = {**redis_settings(kafka_service.address, f"redis://{redis_service.address}/0",
                                  group, unique_name("p")),
                 "onceflow.metrics.port": "0", "onceflow.persistence.interval": "100ms",
                 "onceflow.commit.interval": "100ms"}
    settings = load_settings(harness.packaged_config("demo.conf"), overrides)
    before = set(threading.enumerate())
    # The robots pipeline built for this topic: the packaged module's ``pipeline`` reads
    # ONCEFLOW_ROBOTS_TOPIC once, at its first import, which an earlier test in this process
    # may have made (then the worker read another topic and committed nothing here).
    worker = Worker(settings, robots.build(robots_topic))
    worker.start()
    try:
        deadline = time.monotonic() + 60
        want = {p: ends.get(p, 0) for p in range(2)}
        while committed(kafka_service.address, group, robots_topic, 2) != want:
            assert time.monotonic() < deadline, (
                f"the worker committed {committed(kafka_service.address, group, robots_topic, 2)}"
                f" of {want} in 60 s")
            time.sleep(0.2)
        started = [t for t in threading.enumerate() if t not in before]
        own = sorted(t.name for t in started if not t.name.startswith(POOL))
        pool = [t.name for t in started if t.name.startswith(POOL)]
        # the main thread waits for a stop: it was there before, and counts too
        assert len(own) + 1 <= MAX_THREADS, f"threads: main + {own} (pool {pool})"
        assert len(pool) <= (os.cpu_count() or 1) + 4, pool  # asyncio's default bound
    finally:
        worker.request_stop()
        assert worker.shutdown() == 0
