"""Store durability on real Redis: writes counted only once a replica has them, and the
start-up log of what Redis keeps of an acknowledged write.

A primary and its replica (a second ``redis-server --replicaof``) are started
here; the replica is stopped with SIGSTOP (it keeps its connection, so the
primary goes on sending and only its acknowledgements stop) and thawed again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from helpers import committed, create_topic, expected_counts, stored_states

from onceflow.devtools import harness, services
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_durability import ReplicasBehind
from onceflow.stores.redis_store import RedisStore

PARTITION = ("orders", 0)
BEHIND = "replicas acknowledged a write"  # ReplicasBehind's message, in the retry warnings


@dataclass(frozen=True)
class Replicated:
    primary: ServiceInfo
    replica: ServiceInfo

    def url(self, which: ServiceInfo) -> str:
        return f"redis://{which.address}/0"


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicated]:
    """A private primary and its replica, in sync; tests here stop and thaw the replica."""
    primary = services.start_redis(tmp_path_factory.mktemp("redis-primary"))
    try:
        replica = services.start_redis(tmp_path_factory.mktemp("redis-replica"),
                                       replica_of=primary)
        try:
            yield Replicated(primary, replica)
        finally:
            services.stop(replica)
    finally:
        services.stop(primary)


@pytest.fixture
def stopped_replica(replicated: Replicated) -> Iterator[Callable[[], None]]:
    """Call it to SIGSTOP the replica; it is thawed after the test whatever happens."""
    frozen: list[ServiceInfo] = []

    def stop() -> None:
        services.freeze(replicated.replica)
        frozen.append(replicated.replica)

    yield stop
    for info in frozen:
        services.thaw(info)


def test_a_write_counts_once_the_replica_has_it_and_fails_past_the_timeout_without_it(
    replicated: Replicated, stopped_replica: Callable[[], None],
    unique_name: Callable[..., str],
) -> None:
    prefix = unique_name("ns")
    store = RedisStore(replicated.url(replicated.primary), prefix, "p", wait_replicas=1,
                       wait_timeout=0.3)
    replica = RedisStore(replicated.url(replicated.replica), prefix, "p")
    try:
        guard = {PARTITION: store.take_epochs([PARTITION]).epoch}
        store.save("s", {"guarded": b"1"}, guard=guard)
        store.save("s", {"plain": b"1"})
        # Returned: the replica holds them (read from it at once, no waiting).
        assert replica.load("s", ["guarded", "plain"]) == {"guarded": b"1", "plain": b"1"}

        stopped_replica()
        writes: dict[str, Callable[[], None]] = {
            "guarded states": lambda: store.save("s", {"guarded": b"2"}, guard=guard),
            "plain states": lambda: store.save("s", {"plain": b"2"}),
            "expiring history": lambda: store.save_expiring("h", {"w": b"2"}, 60.0,
                                                            guard=guard),
            "plain expiring": lambda: store.save_expiring("h", {"v": b"2"}, 60.0),
            "guarded outbox": lambda: store.outbox_append({("out|0", 1): b"r"}, guard=guard),
            "plain outbox": lambda: store.outbox_append({("out|0", 2): b"r"}),
        }
        for what, write in writes.items():
            started = time.monotonic()
            with pytest.raises(ReplicasBehind, match="0 of 1 replicas"):
                write()
            assert time.monotonic() - started >= 0.3, what
        # The primary has them, not counted as written: the caller writes them again.
        assert store.load("s", ["guarded", "plain"]) == {"guarded": b"2", "plain": b"2"}
        services.thaw(replicated.replica)
        store.save("s", {"guarded": b"3"}, guard=guard)  # the replica is back: counted
        assert replica.load("s", ["guarded"]) == {"guarded": b"3"}
    finally:
        store.close()
        replica.close()


def test_a_worker_holds_its_commits_while_the_replica_is_stopped_and_loses_nothing(
    kafka_service: ServiceInfo, replicated: Replicated, stopped_replica: Callable[[], None],
    tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    create_topic(kafka_service.address, topic, 4)
    first = generate(3_000, robots=100, seed=71)
    second = generate(3_000, robots=100, seed=72, after=first)
    settings = {"onceflow.pipeline": "onceflow.examples.robots:pipeline",
                "onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": replicated.url(replicated.primary),
                "onceflow.stores.redis.key-prefix": prefix,
                "onceflow.stores.redis.wait-replicas": "1",
                "onceflow.stores.redis.wait-timeout": "300ms",
                "onceflow.commit.interval": "300ms"}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings),
        {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}, tmp_path)
    primary = RedisStore(replicated.url(replicated.primary), prefix, "robots")
    replica = RedisStore(replicated.url(replicated.replica), prefix, "robots")
    worker.start()
    try:
        ends = asyncio.run(harness.produce(kafka_service.address, topic, first.messages))
        _drained(kafka_service.address, group, topic, ends, worker)
        assert stored_states(replica, "per_robot") == expected_counts(first.truth)

        stopped_replica()
        held = committed(kafka_service.address, group, topic, 4)
        assert held == {p: ends.get(p, 0) for p in range(4)}
        later = asyncio.run(harness.produce(kafka_service.address, topic, second.messages))
        # Each failed write is retried with backoff; four of them outlast several commit
        # intervals, no commit advancing meanwhile, and the primary holds the new states
        # all along, uncounted.
        _held_until_logged(worker, BEHIND, 4,
                           lambda: committed(kafka_service.address, group, topic, 4), held)
        assert stored_states(primary, "per_robot") != expected_counts(first.truth)
        assert worker.exited() is None, "the worker must wait for the replica, not die"

        services.thaw(replicated.replica)
        _drained(kafka_service.address, group, topic, later, worker)
        assert worker.terminate(10) == 0
        both = expected_counts(first.truth, second.truth)
        assert stored_states(primary, "per_robot") == both
        assert stored_states(replica, "per_robot") == both
    finally:
        if worker.exited() is None:
            worker.kill()
        primary.close()
        replica.close()


def _drained(bootstrap: str, group: str, topic: str, ends: dict[int, int],
             worker: harness.WorkerProcess) -> None:
    async def wait() -> bool:
        async with harness.CommittedOffsets(bootstrap, group) as offsets:
            return await offsets.wait_for(topic, ends, 90, worker)

    assert asyncio.run(wait()), f"not committed: see {worker.logs[-1]}{worker.log_tail()}"


def _held_until_logged(worker: harness.WorkerProcess, needle: str, count: int,
                       offsets: Callable[[], dict[int, int]], held: dict[int, int],
                       timeout: float = 60) -> None:
    """Until ``needle`` is ``count`` times in the worker's log, the committed offsets
    stay ``held``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logged = worker.logs[-1].read_text(errors="replace").count(needle)
        assert offsets() == held, f"a commit advanced after {logged} failed writes"
        if logged >= count:
            return
        assert worker.exited() is None, f"worker exited: {worker.log_tail()}"
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not {count} times in {timeout}s:{worker.log_tail()}")


@pytest.fixture(scope="module")
def everysec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceInfo]:
    """A private Redis whose AOF is fsynced once a second (a machine crash loses up to it)."""
    info = services.start_redis(tmp_path_factory.mktemp("redis-everysec"),
                                appendfsync="everysec")
    try:
        yield info
    finally:
        services.stop(info)


def test_the_worker_warns_at_start_of_a_redis_that_can_lose_an_acknowledged_write(
    kafka_service: ServiceInfo, everysec: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    create_topic(kafka_service.address, topic, 1)
    settings = {"onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": f"redis://{everysec.address}/0",
                "onceflow.stores.redis.key-prefix": prefix}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings),
        {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}, tmp_path)
    worker.start()
    try:
        asyncio.run(worker.assigned())
        assert worker.terminate(10) == 0
    finally:
        if worker.exited() is None:
            worker.kill()
    log = worker.logs[-1].read_text(errors="replace")
    warning = next((line for line in log.splitlines() if "appendfsync everysec" in line), "")
    assert "WARNING" in warning, log[-3000:]
    assert f"redis at {everysec.address}: appendonly yes, appendfsync everysec" in warning
    assert "onceflow.stores.redis.wait-replicas" in warning


def test_what_is_logged_follows_the_settings_redis_reports(
    redis_service: ServiceInfo, everysec: ServiceInfo, unique_name: Callable[..., str],
) -> None:
    def report(info: ServiceInfo, wait_replicas: int = 0, user: str = "") -> tuple[int, str]:
        store = RedisStore(f"redis://{user}{info.address}/0", unique_name("ns"), "p",
                           wait_replicas=wait_replicas)
        try:
            found = store.durability()
        finally:
            store.close()
        assert found is not None
        return found

    level, message = report(redis_service)  # appendfsync always: kept
    assert (level, message) == (logging.INFO, f"redis at {redis_service.address}: appendonly "
                                "yes, appendfsync always: an acknowledged write survives a crash")
    level, message = report(everysec)
    assert level == logging.WARNING and "with appendfsync everysec" in message, message
    level, message = report(everysec, wait_replicas=1)  # the replicas keep it
    assert level == logging.INFO and "waits for 1 replica(s)" in message, message

    admin = redis.Redis.from_url(f"redis://{everysec.address}/0")
    password = unique_name("pw")
    try:  # a user without CONFIG, as a managed Redis gives
        admin.acl_setuser("limited", enabled=True, passwords=[f"+{password}"],
                          keys=["*"], categories=["+@all"], commands=["-config"])
        level, message = report(everysec, user=f"limited:{password}@")
        assert level == logging.WARNING, message
        assert message.startswith(f"redis at {everysec.address}: could not check its "
                                  "persistence (CONFIG GET refused: "), message
        admin.config_set("appendonly", "no")
        level, message = report(everysec)
        assert level == logging.WARNING and "with no append-only file" in message, message
    finally:
        admin.config_set("appendonly", "yes")
        admin.acl_deluser("limited")
        _wait_for_aof_rewrite(admin)
        admin.close()


def _wait_for_aof_rewrite(client: redis.Redis, timeout: float = 30) -> None:
    """Until the rewrite that turning the AOF on starts is done: Redis refuses SIGTERM
    meanwhile (the fixture's stop would wait 10 s for nothing, then SIGKILL it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = client.info("persistence")
        if not (found["aof_rewrite_in_progress"] or found["aof_rewrite_scheduled"]):
            return
        time.sleep(0.05)
    raise AssertionError(f"the AOF rewrite did not end in {timeout}s")
