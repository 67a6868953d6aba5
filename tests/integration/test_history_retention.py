"""History retention on the real stores: closed windows expire, nothing else does.

The expiry each row carries is read from the server (Redis PTTL, Cassandra
``TTL(value)``); one test then waits for the real expiry, to see the rows go
while the states, the producer-sequence rows and the outbox stay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
from cassandra.cluster import Cluster
from helpers import cassandra_state_ttl, redis_state_ttl

from onceflow.devtools.services import ServiceInfo
from onceflow.stores.base import HISTORY_SUFFIX, StateStore
from onceflow.stores.cassandra_store import CassandraStore
from onceflow.stores.redis_store import RedisStore

STAGE = "per_robot_windows"
SEQUENCES = "__producer_seq__"
STATES = {"robot-1": b'{"v":{"open":{}},"w":[]}', "robot-2": b'{"v":{"open":{}},"w":[]}'}
SEQUENCE_ROWS = {"robots|0": b'{"r-1":[0,41]}'}
HISTORY = {("robot-1", 0): b"3", ("robot-1", 60_000): b"5", ("robot-2", 0): b"1"}
OUTBOX = {("robots-out|0", 1): b"record"}


@dataclass
class Opened:
    """A store client, and the expiry its server reports for one row (None: never)."""

    store: StateStore
    expiry: Callable[[str, str], float | None]  # (stage, key) -> seconds left
    outbox_expiry: Callable[[], float | None]


@pytest.fixture(params=["redis", "cassandra"])
def service(request: pytest.FixtureRequest) -> ServiceInfo:
    info: ServiceInfo = request.getfixturevalue(f"{request.param}_service")
    return info


@pytest.fixture
def open_store(service: ServiceInfo, unique_name: Callable[..., str]
               ) -> Iterator[Callable[[float], Opened]]:
    """``open_store(retention)`` -> a client of a fresh pipeline, and how to read expiries."""
    namespace, closers = unique_name("ns"), []

    def open_(retention: float) -> Opened:
        pipeline = unique_name("p")
        if service.name == "redis":
            url = f"redis://{service.address}/0"
            raw = redis.Redis.from_url(url)
            closers.append(raw.close)
            store: StateStore = RedisStore(url, namespace, pipeline, history_retention=retention)

            def expiry(stage: str, key: str) -> float | None:
                return redis_state_ttl(raw, namespace, pipeline, stage, key)

            def outbox_expiry() -> float | None:
                ms = raw.pttl(f"{namespace}:{pipeline}:outbox")
                assert ms != -2, "the outbox is absent"
                return None if ms == -1 else ms / 1000
        else:
            store = CassandraStore([service.host], pipeline, port=service.port,
                                   keyspace=namespace, protocol_version=3,
                                   history_retention=retention)
            cluster = Cluster([service.host], port=service.port, protocol_version=3)
            session = cluster.connect()
            closers.append(cluster.shutdown)

            def expiry(stage: str, key: str) -> float | None:
                return cassandra_state_ttl(session, namespace, pipeline, stage, key)

            def outbox_expiry() -> float | None:
                rows = list(session.execute(
                    f'SELECT TTL(value) FROM "{namespace}".outbox WHERE pipeline = %s',
                    (pipeline,)))
                assert rows, "the outbox is absent"
                return None if rows[0][0] is None else float(rows[0][0])
        closers.append(store.close)
        return Opened(store, expiry, outbox_expiry)

    yield open_
    for close in reversed(closers):
        close()


def write_everything(store: StateStore) -> None:
    """What a snapshot of a windowed pipeline with producer dedup writes, and an outbox row."""
    store.save_history(STAGE, HISTORY)
    store.save(STAGE, STATES)
    store.save(SEQUENCES, SEQUENCE_ROWS)
    store.outbox_append(OUTBOX)


def history_keys() -> list[str]:
    return [f"{start}|{key}" for key, start in HISTORY]


def assert_the_rest_never_expires(opened: Opened) -> None:
    store = opened.store
    assert store.load(STAGE, list(STATES)) == STATES
    assert store.load(SEQUENCES, list(SEQUENCE_ROWS)) == SEQUENCE_ROWS
    assert store.outbox_load() == {"robots-out|0": [(1, b"record")]}
    assert [opened.expiry(STAGE, key) for key in STATES] == [None, None]
    assert opened.expiry(SEQUENCES, "robots|0") is None
    assert opened.outbox_expiry() is None


def test_without_retention_history_rows_never_expire(
        open_store: Callable[[float], Opened]) -> None:
    opened = open_store(0.0)

    write_everything(opened.store)

    assert [opened.expiry(STAGE + HISTORY_SUFFIX, k) for k in history_keys()] == [None] * 3
    assert sorted(opened.store.scan_history(STAGE)) == sorted(
        (key, start, value) for (key, start), value in HISTORY.items())
    assert_the_rest_never_expires(opened)


def test_history_rows_carry_the_retention_and_nothing_else_does(
        open_store: Callable[[float], Opened]) -> None:
    opened = open_store(3 * 86400 + 0.5)  # Cassandra rounds up to whole seconds

    write_everything(opened.store)

    for key in history_keys():
        left = opened.expiry(STAGE + HISTORY_SUFFIX, key)
        assert left is not None and 3 * 86400 - 10 < left <= 3 * 86400 + 1, (key, left)
    assert_the_rest_never_expires(opened)


def test_history_rows_disappear_after_the_retention_and_states_stay(
        open_store: Callable[[float], Opened]) -> None:
    opened = open_store(2.0)
    write_everything(opened.store)
    assert len(list(opened.store.scan_history(STAGE))) == 3

    deadline = time.monotonic() + 30
    while list(opened.store.scan_history(STAGE)) and time.monotonic() < deadline:
        time.sleep(0.2)

    assert list(opened.store.scan_history(STAGE)) == []
    assert opened.store.load(STAGE + HISTORY_SUFFIX, history_keys()) == {}
    assert_the_rest_never_expires(opened)


def test_a_window_written_again_takes_the_retention_from_its_new_write(
        open_store: Callable[[float], Opened]) -> None:
    """A replay that closes a window again (a crash before its state was written) restarts
    its clock; a row written before the retention was set keeps no expiry until then."""
    opened = open_store(3600.0)
    (key, start), value = next(iter(HISTORY.items()))
    row = f"{start}|{key}"
    opened.store.save(STAGE + HISTORY_SUFFIX, {row: value})  # as written with no retention
    assert opened.expiry(STAGE + HISTORY_SUFFIX, row) is None

    opened.store.save_history(STAGE, {(key, start): value})

    left = opened.expiry(STAGE + HISTORY_SUFFIX, row)
    assert left is not None and 3590 < left <= 3600
