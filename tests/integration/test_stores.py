"""Every state store against a real server: one suite, run on Redis and on Cassandra.

Each test gets its own namespace (a Redis key prefix, a Cassandra keyspace)
and pipeline ids from ``unique_name``; ``open_store`` opens a new client
each call, so a second call is a second client of the same data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from onceflow.devtools import services
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.base import StateStore
from onceflow.stores.cassandra_store import CassandraStore
from onceflow.stores.redis_store import RedisStore
from onceflow.stores.retry import retrying

OpenStore = Callable[..., StateStore]
STAGE = "per_robot"


@pytest.fixture(params=["redis", "cassandra"])
def service(request: pytest.FixtureRequest) -> ServiceInfo:
    """The server under test (only the one a test's parameter names is started)."""
    info: ServiceInfo = request.getfixturevalue(f"{request.param}_service")
    return info


@pytest.fixture
def open_store(
    service: ServiceInfo, unique_name: Callable[..., str]
) -> Iterator[OpenStore]:
    """``open_store(pipeline_id, timeout=10.0)`` -> a new client in this test's namespace."""
    namespace = unique_name("ns")
    opened: list[StateStore] = []

    def open_(pipeline_id: str, timeout: float = 10.0) -> StateStore:
        store: StateStore
        if service.name == "redis":
            store = RedisStore(f"redis://{service.address}/0", namespace, pipeline_id, timeout)
        else:
            store = CassandraStore([service.host], pipeline_id, port=service.port,
                                   keyspace=namespace, protocol_version=3,
                                   request_timeout=timeout)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: OpenStore, unique_name: Callable[..., str]) -> StateStore:
    return open_store(unique_name("p"))


def test_load_of_missing_keys_is_empty(store: StateStore) -> None:
    assert store.load(STAGE, ["robot-1", "robot-2"]) == {}


def test_save_then_load_round_trips(store: StateStore) -> None:
    rows = {"robot-1": b'{"v":{"ok":1}}', "robot-2": bytes(range(256)), "robot-3": b""}

    store.save(STAGE, rows)

    assert store.load(STAGE, ["robot-1", "robot-2", "robot-3"]) == rows
    assert store.load(STAGE, ["robot-2", "absent"]) == {"robot-2": rows["robot-2"]}


def test_overwrite_keeps_only_the_latest_value(store: StateStore) -> None:
    store.save(STAGE, {"robot-1": b"first", "robot-2": b"other"})
    store.save(STAGE, {"robot-1": b"second"})
    store.save(STAGE, {"robot-1": b"third"})

    assert store.load(STAGE, ["robot-1"]) == {"robot-1": b"third"}
    assert sorted(store.scan(STAGE)) == [("robot-1", b"third"), ("robot-2", b"other")]


ODD_KEYS = [":", "a:b:c", "*", "robot-*", "?", "[ab]", "back\\slash", "with space", " ",
            "'quoted'", '"double"', "ünïcødé", "日本語", "emoji 🤖", "tab\there", ""]


def test_keys_with_odd_characters(store: StateStore) -> None:
    rows = {key: f"value of {key!r}".encode() for key in ODD_KEYS}

    store.save(STAGE, rows)

    assert store.load(STAGE, ODD_KEYS) == rows
    assert dict(store.scan(STAGE)) == rows
    assert store.load(STAGE, ["robot-1", "a:b", "a"]) == {}  # no glob or prefix match


def test_5000_keys_save_load_and_scan_exactly(store: StateStore) -> None:
    rows = {f"robot-{i:05d}": f'{{"v":{{"ok":{i}}}}}'.encode() for i in range(5000)}

    store.save(STAGE, rows)

    assert store.load(STAGE, list(rows)) == rows
    scanned = list(store.scan(STAGE))
    assert len(scanned) == 5000
    assert dict(scanned) == rows


def test_scan_isolates_pipelines_and_stages(
    open_store: OpenStore, unique_name: Callable[..., str]
) -> None:
    pipeline = unique_name("p")
    # Ids that are prefixes of each other must not leak into each other's scans.
    first, second = open_store(pipeline), open_store(f"{pipeline}x")
    first.save("s", {"k": b"first/s"})
    first.save("s.x", {"k": b"first/s.x"})
    first.save("s2", {"k": b"first/s2", "j": b"first/s2/j"})
    second.save("s", {"k": b"second/s"})

    assert list(first.scan("s")) == [("k", b"first/s")]
    assert list(first.scan("s.x")) == [("k", b"first/s.x")]
    assert sorted(first.scan("s2")) == [("j", b"first/s2/j"), ("k", b"first/s2")]
    assert list(second.scan("s")) == [("k", b"second/s")]
    assert list(second.scan("s2")) == []
    assert first.load("s", ["k", "j"]) == {"k": b"first/s"}


def test_stats_add_up_per_pipeline(
    open_store: OpenStore, unique_name: Callable[..., str]
) -> None:
    store, other = open_store(unique_name("p")), open_store(unique_name("p"))
    assert store.read_stats() == {}

    store.add_stats({"records": 3, "duplicates": 0})
    store.add_stats({"records": 2, "dead_letters": 1})
    store.add_stats({"records": 10_000_000_000})
    other.add_stats({"records": 7})

    assert store.read_stats() == {"records": 10_000_000_005, "dead_letters": 1}
    assert other.read_stats() == {"records": 7}


def test_empty_save_load_and_stats_are_no_ops(store: StateStore) -> None:
    store.save(STAGE, {})
    store.add_stats({})
    store.add_stats({"records": 0})

    assert store.load(STAGE, []) == {}
    assert list(store.scan(STAGE)) == []
    assert store.read_stats() == {}


def test_a_second_client_sees_the_first_clients_writes(
    open_store: OpenStore, unique_name: Callable[..., str]
) -> None:
    pipeline = unique_name("p")
    writer = open_store(pipeline)
    writer.save(STAGE, {"robot-1": b"one", "robot-2": b"two"})
    writer.add_stats({"records": 4})
    writer.close()

    reader = open_store(pipeline)

    assert reader.load(STAGE, ["robot-1", "robot-2"]) == {"robot-1": b"one", "robot-2": b"two"}
    assert sorted(reader.scan(STAGE)) == [("robot-1", b"one"), ("robot-2", b"two")]
    assert reader.read_stats() == {"records": 4}


def test_a_failed_write_raises_and_the_worker_retry_writes_every_row(
    service: ServiceInfo, open_store: OpenStore, unique_name: Callable[..., str]
) -> None:
    pipeline = unique_name("p")
    store = open_store(pipeline, timeout=1.0)
    store.save(STAGE, {"warm-up": b"connected, schema created"})
    rows = {f"robot-{i}": b"after the outage" for i in range(200)}

    services.freeze(service)
    try:
        with pytest.raises((ConnectionError, redis.ConnectionError, redis.TimeoutError)):
            store.save(STAGE, rows)
    finally:
        services.thaw(service)
    # What the persistence actor does: retry (transient errors only) until it is written.
    retrying("save", lambda: store.save(STAGE, rows), give_up_after=60)

    assert open_store(pipeline).load(STAGE, list(rows)) == rows


def test_history_rows_round_trip_beside_the_states(store: StateStore) -> None:
    history = {("robot-1", 1_000): b"w1", ("robot-1", 2_000): b"w2", ("a|b:c", 1_000): b"odd"}
    store.save(STAGE, {"robot-1": b"state"})

    store.save_history(STAGE, history)
    store.save_history(STAGE, {("robot-1", 2_000): b"w2"})  # idempotent

    assert sorted(store.scan_history(STAGE)) == sorted(
        (key, start, value) for (key, start), value in history.items()
    )
    assert list(store.scan(STAGE)) == [("robot-1", b"state")]


# Lanes are "<topic>|<partition>": the '|' inside a lane must survive the round trip.
LANE_A, LANE_B, LANE_C = "orders.v1-eu_west|3", "orders.v1-eu_west|12", "fleet_events|0"


def test_outbox_round_trips_by_lane_in_seq_order(store: StateStore) -> None:
    store.outbox_append({(LANE_A, 7): b"a7", (LANE_B, 1): b"b1", (LANE_A, 2): b"a2"})
    store.outbox_append({(LANE_A, 10): bytes(range(256)), (LANE_C, 0): b"",
                         (LANE_A, 2): b"a2"})  # the same key and value again: a retry

    assert store.outbox_load() == {
        LANE_A: [(2, b"a2"), (7, b"a7"), (10, bytes(range(256)))],  # 10 after 7 and 2
        LANE_B: [(1, b"b1")],
        LANE_C: [(0, b"")],
    }


def test_outbox_remove_drops_only_the_given_keys(store: StateStore) -> None:
    store.outbox_append({(LANE_A, 1): b"a1", (LANE_A, 2): b"a2", (LANE_B, 1): b"b1"})

    store.outbox_remove([(LANE_A, 1), (LANE_B, 1), (LANE_B, 99), ("absent|0", 1)])
    store.outbox_remove([(LANE_A, 1)])  # already gone

    assert store.outbox_load() == {LANE_A: [(2, b"a2")]}


def test_outbox_isolates_pipelines(
    open_store: OpenStore, unique_name: Callable[..., str]
) -> None:
    pipeline = unique_name("p")
    first, second = open_store(pipeline), open_store(f"{pipeline}x")
    first.outbox_append({(LANE_A, 1): b"first"})
    second.outbox_append({(LANE_A, 1): b"second", (LANE_B, 5): b"second/b"})

    second.outbox_remove([(LANE_A, 1)])

    assert first.outbox_load() == {LANE_A: [(1, b"first")]}
    assert second.outbox_load() == {LANE_B: [(5, b"second/b")]}
    assert open_store(pipeline).outbox_load() == {LANE_A: [(1, b"first")]}  # durable


def test_outbox_2000_records_round_trip(store: StateStore) -> None:
    lanes = [f"topic-{t}|{p}" for t in range(2) for p in range(5)]
    rows = {(lanes[i % 10], i): f"record {i}".encode() for i in range(2000)}

    store.outbox_append(rows)

    loaded = store.outbox_load()
    assert sorted(loaded) == sorted(lanes)
    assert {(lane, seq): value for lane, records in loaded.items()
            for seq, value in records} == rows
    assert all([seq for seq, _ in records] == list(range(lanes.index(lane), 2000, 10))
               for lane, records in loaded.items())
    store.outbox_remove(list(rows))
    assert store.outbox_load() == {}


def test_empty_outbox_calls_are_no_ops(store: StateStore) -> None:
    store.outbox_append({})
    store.outbox_remove([])

    assert store.outbox_load() == {}


def test_a_store_first_used_during_an_outage_works_once_it_is_over(
    service: ServiceInfo, open_store: OpenStore, unique_name: Callable[..., str]
) -> None:
    store = open_store(unique_name("p"), timeout=1.0)  # not connected yet
    rows = {(LANE_A, 1): b"a1", (LANE_B, 1): b"b1"}

    services.freeze(service)
    try:
        with pytest.raises((ConnectionError, redis.ConnectionError, redis.TimeoutError)):
            store.outbox_append(rows)
        with pytest.raises((ConnectionError, redis.ConnectionError, redis.TimeoutError)):
            store.outbox_load()  # still the error callers retry on
    finally:
        services.thaw(service)
    retrying("outbox_append", lambda: store.outbox_append(rows), give_up_after=60)

    assert store.outbox_load() == {LANE_A: [(1, b"a1")], LANE_B: [(1, b"b1")]}


def test_key_homes_are_claimed_once_and_the_winner_is_told_to_every_claimer(
    open_store: OpenStore, unique_name: Callable[..., str]
) -> None:
    """Two workers (two clients) claim overlapping keys: the first claim of a key wins."""
    pipeline = unique_name("p")
    first, second = open_store(pipeline), open_store(pipeline)
    assert first.claim_homes(STAGE, {"c1": "orders|0", "c:2 é": "orders|0"}) == {
        "c1": "orders|0", "c:2 é": "orders|0"}
    assert second.claim_homes(STAGE, {"c1": "orders|1", "c3": "orders|1"}) == {
        "c1": "orders|0", "c3": "orders|1"}
    assert first.claim_homes(STAGE, {"c3": "orders|0"}) == {"c3": "orders|1"}
    assert first.claim_homes("other_stage", {"c1": "orders|2"}) == {"c1": "orders|2"}
    assert first.claim_homes(STAGE, {}) == {}
    assert open_store(unique_name("p")).claim_homes(STAGE, {"c1": "x|5"}) == {"c1": "x|5"}
