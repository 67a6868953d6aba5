"""State expiry on the real stores: a state not folded for ``expire_after`` leaves the
store by the store's own TTL, its watermarks with it, and its key starts fresh.

The runner folds, ``actors.snapshot_rows`` takes the rows and persistence's
``save_states`` writes them under a guard (on Redis: the fencing script, with SET PX), as
a worker does; each test waits for the row to be gone (polled, bounded), never a fixed
sleep. The expiry each row carries is read from the server (Redis PTTL, Cassandra
``TTL(value)``). The last test runs a worker process on Redis with the config default.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from cassandra.cluster import Cluster
from helpers import (
    cassandra_state_ttl,
    expected_counts,
    produce,
    redis_state_ttl,
    start_worker,
    stored_states,
    wait_for_log,
)

from onceflow.actors.snapshot_rows import snapshot_rows
from onceflow.checkpoint.persistence import save_states
from onceflow.devtools import harness
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stages import Aggregate, Pipeline, Tumbling
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import AggregateState, decode_state
from onceflow.stores.base import HISTORY_SUFFIX, StateStore
from onceflow.stores.cassandra_store import CassandraStore
from onceflow.stores.fencing import Guard
from onceflow.stores.redis_store import RedisStore
from onceflow.testing_records import Consumed as Rec

BOUND = 60.0  # s: the longest a poll waits for what it waits for


@dataclass
class Opened:
    """A store client of a fresh pipeline, its kind, and the expiry its server reports for
    one row (None: never)."""

    store: StateStore
    kind: str
    expiry: Callable[[str, str], float | None]  # (stage, key) -> seconds left


@pytest.fixture(params=["redis", "cassandra"])
def opened(request: pytest.FixtureRequest, unique_name: Callable[..., str]
           ) -> Iterator[Opened]:
    service: ServiceInfo = request.getfixturevalue(f"{request.param}_service")
    namespace, pipeline, closers = unique_name("ns"), unique_name("p"), []
    if service.name == "redis":
        url = f"redis://{service.address}/0"
        raw = redis.Redis.from_url(url)
        closers.append(raw.close)
        store: StateStore = RedisStore(url, namespace, pipeline)

        def expiry(stage: str, key: str) -> float | None:
            return redis_state_ttl(raw, namespace, pipeline, stage, key)
    else:
        store = CassandraStore([service.host], pipeline, port=service.port,
                               keyspace=namespace, protocol_version=3)
        cluster = Cluster([service.host], port=service.port, protocol_version=3)
        session = cluster.connect()
        closers.append(cluster.shutdown)

        def expiry(stage: str, key: str) -> float | None:
            return cassandra_state_ttl(session, namespace, pipeline, stage, key)
    closers.append(store.close)
    yield Opened(store, service.name, expiry)
    for close in reversed(closers):
        close()


def counts(store: str, expire_after: float) -> Pipeline:
    """{"k": key, "ts": ms}: a count per key, and one per key and second."""
    return (
        Pipeline("p", topics=("in",), format="json")
        .aggregate("count", key=lambda r: r["k"], init=lambda: 0, fold=lambda c, _: c + 1,
                   store=store, expire_after=expire_after)
        .aggregate("per_second", key=lambda r: r["k"], init=lambda: 0,
                   fold=lambda c, _: c + 1, window=Tumbling(1000, lambda r: r["ts"]),
                   store=store, expire_after=expire_after)
    )


def record(offset: int, key: str, ts: int = 0) -> Rec:
    return Rec("in", 0, offset, json.dumps({"k": key, "ts": ts}).encode())


def runner_on(store: StateStore, pipeline: Pipeline) -> PipelineRunner:
    def load(spec: Aggregate, keys: Sequence[str]) -> Mapping[str, AggregateState]:
        return {key: decode_state(row) for key, row in store.load(spec.id, keys).items()}

    return PipelineRunner(pipeline, load, "dlq")


def persist(runner: PipelineRunner, store: StateStore, guard: Guard, number: int) -> None:
    """One snapshot as persistence writes it: downstream first, closed windows first."""
    for rows in reversed(snapshot_rows(runner, None, number)):
        if rows.closed_windows:
            store.save_history(rows.stage_id, rows.closed_windows, guard=guard)
        save_states(store, rows, guard)
    for table in runner.tables:
        table.written(number)


def wait_gone(store: StateStore, stage: str, key: str) -> float:
    """Poll until the store has no row of ``key`` (bounded); answers how long it took."""
    start = time.monotonic()
    while store.load(stage, [key]):
        assert time.monotonic() - start < BOUND, f"{stage}:{key} still stored after {BOUND}s"
        time.sleep(0.1)
    return time.monotonic() - start


def test_a_state_leaves_the_store_after_expire_after_and_its_key_starts_fresh(
        opened: Opened) -> None:
    store = opened.store
    runner = runner_on(store, counts(opened.kind, 2))
    guard = store.take_epochs([("in", 0)]).guard
    runner.process([record(0, "a"), record(1, "a")])
    persist(runner, store, guard, 1)
    count = runner.tables[0]

    left = opened.expiry("count", "a")
    assert left is not None and 0 < left <= 2, left  # set in the (guarded) write itself
    assert decode_state(store.load("count", ["a"])["a"]).watermarks == {("in", 0): (1,)}
    wait_gone(store, "count", "a")
    assert count.expire() == 1 and "a" not in count.states  # the cache's copy goes too

    # Its watermarks went with it: a replay of an event older than the expiry counts again.
    outcome = runner.process([record(1, "a")])
    assert outcome.folded["count"] == 1 and count.states["a"].value == 1
    persist(runner, store, guard, 2)
    again = decode_state(store.load("count", ["a"])["a"])
    assert (again.value, again.watermarks) == (1, {("in", 0): (1,)})
    left = opened.expiry("count", "a")
    assert left is not None and 0 < left <= 2, left  # written again: expiring again


def test_a_windowed_state_expires_only_once_its_last_window_closed(opened: Opened) -> None:
    store = opened.store
    runner = runner_on(store, counts(opened.kind, 3))
    guard = store.take_epochs([("in", 0)]).guard
    per_second = runner.tables[1]
    runner.process([record(0, "a", ts=100)])
    persist(runner, store, guard, 1)
    assert opened.expiry("per_second", "a") is None  # a window open: no expiry at all

    # b moves the partition's watermark past a's window, which closes (a history row).
    runner.process([record(1, "b", ts=5000)])
    persist(runner, store, guard, 2)
    assert list(store.scan_history("per_second")) == [("a", 0, b"1")]
    left = opened.expiry("per_second", "a")
    assert left is not None and 0 < left <= 3, left  # its expiry starts now
    assert opened.expiry("per_second", "b") is None  # b's window is open

    wait_gone(store, "per_second", "a")
    # the cache's copy goes too (taken before the write, so due before the row was)
    assert per_second.expire() == 1
    assert set(per_second.states) == {"b"}  # past its expiry too, but open: kept
    assert store.load("per_second", ["b"]) and opened.expiry("per_second", "b") is None
    assert store.load("per_second" + HISTORY_SUFFIX, ["0|a"])  # history keeps its own rule


# --- a worker -----------------------------------------------------------------------------


def states_of(redis_url: str, prefix: str) -> dict[str, Any]:
    store = RedisStore(redis_url, prefix, "robots")
    try:
        return stored_states(store, "per_robot")
    finally:
        store.close()


def poll(read: Callable[[], Any], wanted: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND
    while (found := read()) != wanted:
        assert time.monotonic() < deadline, f"{what}: {found} after {BOUND}s"
        time.sleep(0.1)


def test_a_worker_expires_idle_states_and_their_keys_count_again_from_zero(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """``onceflow.state.expire-after`` on a worker: the robots' states leave Redis once
    idle that long, and the same robots' next reports count from zero (not on top of
    their first counts, which the worker's cache would give)."""
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    asyncio.run(harness.create_topic(kafka_service.address, topic, 1,
                                    configs={"retention.ms": "86400000"}))
    first = generate(300, robots=10, seed=11)
    produce(kafka_service.address, topic, first.messages)
    log = tmp_path / "worker.log"
    worker = start_worker(kafka_service.address, redis_url, group, prefix, topic, log,
                          ["--set", "onceflow.state.expire-after=5s"])
    try:
        wait_for_log(worker, log, "states expire after {'per_robot': 5.0}", timeout=BOUND)
        poll(lambda: states_of(redis_url, prefix), expected_counts(first.truth),
             "the first counts")
        poll(lambda: states_of(redis_url, prefix), {}, "the states, expired")
        second = generate(200, robots=10, seed=12, after=first)
        produce(kafka_service.address, topic, second.messages)
        poll(lambda: states_of(redis_url, prefix), expected_counts(second.truth),
             "the second counts, from zero")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    # The start-up check: the embedded broker (Tansu) closes the connection on aiokafka's
    # DescribeConfigs, so it is logged as not checked (the warning itself: unit tests).
    text = log.read_text()
    assert f"topic {topic!r} keeps records 86400s" in text or (
        "state expiry not checked against the topics' retention: reading retention.ms of "
        f"{topic} failed" in text), text[-3000:]
