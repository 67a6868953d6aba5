"""The executor-side readers return every row exactly once: compared with a full read.

Cassandra: a table holding several pipelines and stages, read by token range
(the cluster's vnode ranges, hundreds of them, spread over Spark tasks).
Redis: keys with glob metacharacters and non-ASCII bytes, read by SCAN pattern shards.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from onceflow.analytics import readers
from onceflow.devtools.services import ServiceInfo
from onceflow.stages.state import AggregateState, encode_state
from onceflow.stores.base import StateStore
from onceflow.stores.cassandra_store import CassandraStore
from onceflow.stores.redis_store import RedisStore

KEYS = [f"robot-{i:04d}" for i in range(1500)] + ["a*b", "c?d", "[e]", "f\\g", "h:i", "ünï",
                                                   "日本", "", "x|y"]


def fill(store: StateStore, seed: int) -> None:
    """Open windows in states and closed ones in history, for two stages."""
    rng = random.Random(seed)
    for stage in ("m", "d"):
        states = {}
        history = {}
        for key in KEYS:
            opened = {str(60_000 * w): {"ok": rng.randrange(5), "failed": rng.randrange(3)}
                      for w in rng.sample(range(10), rng.randrange(0, 3))}
            states[key] = encode_state(AggregateState({"open": opened, "max_ts": 1},
                                                      {("t", 0): (rng.randrange(100), 0)}))
            for w in rng.sample(range(10, 20), rng.randrange(0, 3)):
                history[(key, 60_000 * w)] = json.dumps({"ok": 1, "failed": w}).encode()
        store.save(stage, states)
        store.save_history(stage, history)


def full_read(store: StateStore, stages: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
    """Every window through the store's own (whole-table) scan."""
    for stage in stages:
        for key, value in store.scan(stage):
            yield from readers.decode_row(stage, key, value, stages)
        for key, start, value in store.scan_history(stage):
            yield (stage, key, start, True, value.decode())


def as_tuples(frame: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in frame.select(*readers.WINDOW_COLUMNS).collect()]


def test_cassandra_token_range_reader_reads_each_row_once(
        spark: Any, cassandra_service: ServiceInfo, unique_name: Callable[..., str]) -> None:
    keyspace = unique_name("tr")
    stores = [CassandraStore([cassandra_service.host], pipeline, port=cassandra_service.port,
                             keyspace=keyspace, protocol_version=3)
              for pipeline in ("fleet", "other-pipeline")]
    try:
        for n, store in enumerate(stores):
            fill(store, seed=n)
        store = stores[0]
        store.save("not-windowed", {"k": encode_state(AggregateState({"ok": 1}))})
        source = readers.CassandraSource((cassandra_service.host,), cassandra_service.port,
                                         keyspace, "fleet")
        ranges = readers.ring_ranges(source, 8)
        assert len(ranges) >= 256  # one per vnode of the node
        got = as_tuples(readers.cassandra_windows(spark, source, ("m", "d"), splits=8))
        want = list(full_read(store, ("m", "d")))
        assert len(want) > 5_000
        assert len(got) == len(set(got))  # nothing read twice
        assert Counter(got) == Counter(want)
        # Read without the dedup of the DataFrame: the raw range reads never overlap either.
        raw = list(readers.read_token_ranges(source, ranges, ("m", "d")))
        assert Counter(raw) == Counter(want)
    finally:
        for store in stores:
            store.close()


def test_redis_shard_reader_reads_each_key_once(
        spark: Any, redis_service: ServiceInfo, unique_name: Callable[..., str]) -> None:
    url = f"redis://{redis_service.address}/0"
    prefix = unique_name("rs")
    store = RedisStore(url, prefix, "fleet")
    other = RedisStore(url, prefix, "fleet-2")  # a pipeline whose id extends ours
    try:
        fill(store, seed=1)
        fill(other, seed=2)
        source = readers.RedisSource(url, prefix, "fleet")
        got = as_tuples(readers.redis_windows(spark, source, ("m", "d"), shards=8))
        want = list(full_read(store, ("m", "d")))
        assert len(want) > 5_000
        assert len(got) == len(set(got))
        assert Counter(got) == Counter(want)
        raw = list(readers.read_redis_shard(
            source, readers.redis_shard_patterns(source, ("m", "d"), 8), ("m", "d")))
        assert Counter(raw) == Counter(want)
    finally:
        store.close()
        other.close()
