"""Worker settings shared by the outage tests."""

from __future__ import annotations

import asyncio
import random
import urllib.request
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from onceflow.devtools import harness


def quick_recovery(bootstrap: str, redis_url: str, prefix: str) -> dict[str, str]:
    """Worker settings that notice a silent broker in seconds and restart patiently."""
    return {"onceflow.kafka.bootstrap-servers": bootstrap,
            "onceflow.stores.redis.url": redis_url,
            "onceflow.stores.redis.key-prefix": prefix,
            "onceflow.kafka.request-timeout": "5s",
            "onceflow.kafka.connection-checker.check-interval": "2s",
            "onceflow.kafka.connection-checker.max-retries": "1",
            "onceflow.supervision.max-restarts": "20",
            "onceflow.supervision.within": "5m",
            "onceflow.supervision.backoff.initial": "500ms",
            "onceflow.supervision.backoff.max": "5s",
            # The outages here outlast five identical stream failures (the default
            # max-repeats); the tests check recovery, so the loop bound is the budget's.
            "onceflow.supervision.max-repeats": "20"}


def metric(port: int, name: str, absent: float | None = None) -> float:
    """One sample of the worker's /metrics (``name`` with its labels); ``absent`` if none."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        found = series(response.read().decode()).get(name)
    if found is not None:
        return found
    if absent is not None:
        return absent
    raise AssertionError(f"no metric {name}")


def series(text: str) -> dict[str, float]:
    """The samples of a /metrics text by ``name`` or ``name{label="value",...}`` (labels
    sorted), without the ``pipeline`` label every sample carries."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            inner = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())
                             if k != "pipeline")
            found[f"{sample.name}{{{inner}}}" if inner else sample.name] = sample.value
    return found


async def drained(bootstrap: str, group: str, topic: str, ends: dict[int, int],
                  worker: harness.WorkerProcess, timeout: float = 180) -> None:
    """Wait until the group committed ``ends`` (partition -> end offset) of ``topic``."""
    async with harness.CommittedOffsets(bootstrap, group) as offsets:
        assert await offsets.wait_for(topic, ends, timeout, worker), f"see {worker.logs[-1]}"


async def kill_in_turn(workers: Sequence[harness.WorkerProcess], each: int,
                       rng: random.Random) -> None:
    """SIGKILL every worker ``each`` times, in a random order: each kill once its victim
    holds partitions and 0.5-3 s more, the victim restarted at once."""
    victims = list(workers) * each
    rng.shuffle(victims)
    for victim in victims:
        await victim.assigned()
        await asyncio.sleep(rng.uniform(0.5, 3.0))
        victim.kill()
        victim.start()
