"""Read persisted windows into Spark, in the executors, not the driver.

Every source yields the same rows, ``(stage, key, window_start, closed,
value)``: one per window, ``closed`` for history rows (final values) and not
for windows still open in a key's current state, ``value`` the window's
value as JSON. A non-windowed aggregate (one of the ``plain`` stages) gives
one row per key, with its current state and ``window_start`` null. A window
is in history or open, never both (the history row is written before the
state that drops it; where both exist after a crash between the two writes,
they are equal and readers keep the history row).

* Cassandra: the Murmur3 token ring is cut into ranges, the ranges are
  spread over ``splits`` Spark partitions, and each task opens its own
  driver session and reads its ranges with
  ``WHERE token(pipeline, stage, key) > ? AND token(...) <= ?`` (no JVM
  connector: the Python driver runs inside the task).
* Redis: keys are split into ``shards`` disjoint SCAN patterns by their last
  byte (``<prefix>:<pipeline>:s:<stage>:*[<bytes>]``); each task SCANs with
  its pattern and MGETs what it found.
* Landing zone: Spark's own Parquet reader over ``<dir>/stage=<id>/``.

Executors import this module, so onceflow (and the store drivers) must be
installed where they run; in ``local[*]`` that is this virtualenv. They log
in with the worker's settings (``access``: the password travels to them in
the task, the TLS files must be at the same paths there).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from onceflow.stages.state import decode_state
from onceflow.stores.access import NO_ACCESS, StoreAccess, cassandra_options, redis_options
from onceflow.stores.base import HISTORY_SUFFIX

__all__ = [
    "MAX_TOKEN",
    "MIN_TOKEN",
    "WINDOW_COLUMNS",
    "CassandraSource",
    "RedisSource",
    "cassandra_windows",
    "decode_row",
    "landing_windows",
    "read_token_ranges",
    "redis_shard_patterns",
    "redis_windows",
    "token_ranges",
    "window_schema",
]

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1
WINDOW_COLUMNS = ("stage", "key", "window_start", "closed", "value")
Row = tuple[str, str, int | None, bool, str]


def window_schema() -> Any:
    from pyspark.sql.types import (
        BooleanType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    return StructType([
        StructField("stage", StringType(), False),
        StructField("key", StringType(), False),
        StructField("window_start", LongType(), True),
        StructField("closed", BooleanType(), False),
        StructField("value", StringType(), False),
    ])


def decode_row(stage_row: str, key: str, value: bytes, stages: Iterable[str],
               plain: Iterable[str] = ()) -> list[Row]:
    """One stored row -> its windows (or its state, for ``plain`` stages); [] for others.

    ``stage_row`` is the store's stage name: ``<stage>`` for current states,
    ``<stage>#history`` for closed windows (key ``<start>|<key>``).
    """
    if stage_row in plain:
        return [(stage_row, key, None, False,
                 json.dumps(decode_state(value).value, separators=(",", ":")))]
    wanted = set(stages)
    if stage_row.endswith(HISTORY_SUFFIX):
        stage = stage_row[: -len(HISTORY_SUFFIX)]
        if stage not in wanted:
            return []
        start, _, robot = key.partition("|")
        return [(stage, robot, int(start), True, value.decode())]
    if stage_row not in wanted:
        return []
    state = decode_state(value).value
    if not isinstance(state, dict) or "open" not in state:
        return []  # not a windowed aggregate
    return [(stage_row, key, int(start), False, json.dumps(v, separators=(",", ":")))
            for start, v in state["open"].items()]


# --- Cassandra ---------------------------------------------------------------


def token_ranges(count: int) -> list[tuple[int, int]]:
    """``count`` half-open ranges ``(low, high]`` covering the whole Murmur3 ring.

    Murmur3 never gives a key the token ``MIN_TOKEN``, so ``(MIN, MAX]``
    is every key.
    """
    if count < 1:
        raise ValueError("count must be >= 1")
    span = MAX_TOKEN - MIN_TOKEN
    bounds = [MIN_TOKEN + span * i // count for i in range(count)] + [MAX_TOKEN]
    return [(bounds[i], bounds[i + 1]) for i in range(count) if bounds[i] < bounds[i + 1]]


@dataclass(frozen=True)
class CassandraSource:
    """Where the states table is (plain data, shipped to every task)."""

    contact_points: tuple[str, ...]
    port: int
    keyspace: str
    pipeline_id: str
    protocol_version: int = 3
    local_datacenter: str | None = None
    consistency: str = "LOCAL_QUORUM"
    request_timeout: float = 30.0
    access: StoreAccess = NO_ACCESS


def ring_ranges(source: CassandraSource, minimum: int) -> list[tuple[int, int]]:
    """The cluster's own token ranges (one per vnode), each further cut so that
    there are at least ``minimum`` ranges; equal slices if the ring is unknown."""
    from cassandra.cluster import Cluster

    options: dict[str, Any] = (
        {"protocol_version": source.protocol_version} if source.protocol_version else {})
    cluster = Cluster(list(source.contact_points), port=source.port, **options,
                      **cassandra_options(source.access))
    try:
        cluster.connect()
        token_map = cluster.metadata.token_map
        tokens = sorted(int(t.value) for t in token_map.ring) if token_map else []
    finally:
        cluster.shutdown()
    if not tokens:
        return token_ranges(minimum)
    bounds = [MIN_TOKEN, *(t for t in tokens if MIN_TOKEN < t < MAX_TOKEN), MAX_TOKEN]
    ranges = [(lo, hi) for lo, hi in itertools.pairwise(bounds) if lo < hi]
    parts = -(-minimum // len(ranges))
    if parts <= 1:
        return ranges
    cut = []
    for lo, hi in ranges:
        edges = [lo + (hi - lo) * i // parts for i in range(parts)] + [hi]
        cut += [(a, b) for a, b in itertools.pairwise(edges) if a < b]
    return cut


def read_token_ranges(source: CassandraSource, ranges: Iterable[tuple[int, int]],
                      stages: Sequence[str], plain: Sequence[str] = ()) -> Iterator[Row]:
    """Runs in a Spark task: one session, every row of this pipeline in ``ranges``."""
    from cassandra import ConsistencyLevel
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
    from cassandra.query import tuple_factory

    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(source.local_datacenter)),
        consistency_level=ConsistencyLevel.name_to_value[source.consistency],
        request_timeout=source.request_timeout,
        row_factory=tuple_factory,
    )
    options: dict[str, Any] = (
        {"protocol_version": source.protocol_version} if source.protocol_version else {})
    cluster = Cluster(list(source.contact_points), port=source.port,
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile}, **options,
                      **cassandra_options(source.access))
    try:
        session = cluster.connect()
        columns = "token(pipeline, stage, key)"
        query = session.prepare(
            f'SELECT pipeline, stage, key, value FROM "{source.keyspace}".states '
            f"WHERE {columns} > ? AND {columns} <= ?")
        query.fetch_size = 1000
        for low, high in ranges:
            for pipeline, stage, key, value in session.execute(query, (low, high)):
                if pipeline == source.pipeline_id:
                    yield from decode_row(stage, key, value, stages, plain)
    finally:
        cluster.shutdown()


def cassandra_windows(spark: Any, source: CassandraSource, stages: Sequence[str],
                      splits: int, plain: Sequence[str] = ()) -> Any:
    """A DataFrame of every window of ``stages`` (and state of ``plain`` stages), read by
    token range in the executors."""
    ranges = ring_ranges(source, splits)
    slices = min(splits, len(ranges))
    rdd = spark.sparkContext.parallelize(ranges, slices).mapPartitions(
        lambda part: read_token_ranges(source, list(part), tuple(stages), tuple(plain)))
    return _prefer_history(spark.createDataFrame(rdd, window_schema()))


# --- Redis -------------------------------------------------------------------


@dataclass(frozen=True)
class RedisSource:
    url: str
    key_prefix: str
    pipeline_id: str
    access: StoreAccess = NO_ACCESS


def _glob_escape(text: bytes) -> bytes:
    return b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in text)


def redis_shard_patterns(source: RedisSource, stages: Sequence[str], shards: int
                         ) -> list[tuple[str, bytes, bool]]:
    """(store stage name, SCAN MATCH pattern, also read the empty key) per shard.

    The patterns of one stage name split its keys by last byte
    (``b % shards``), so each key matches exactly one; the empty key (no
    last byte) is read by the first shard with a plain GET.
    """
    if not 1 <= shards <= 256:
        raise ValueError("shards must be in 1..256")
    classes = [b"".join(b"\\" + bytes([b]) for b in range(256) if b % shards == i)
               for i in range(shards)]
    patterns = []
    for stage in stages:
        for name in (stage, stage + HISTORY_SUFFIX):
            base = _glob_escape(f"{source.key_prefix}:{source.pipeline_id}:s:{name}:".encode())
            patterns += [(name, base + b"*[" + cls + b"]", i == 0)
                         for i, cls in enumerate(classes)]
    return patterns


def read_redis_shard(source: RedisSource, shards: Iterable[tuple[str, bytes, bool]],
                     stages: Sequence[str], plain: Sequence[str] = ()) -> Iterator[Row]:
    """Runs in a Spark task: SCAN each pattern, MGET in batches, decode."""
    import redis

    client = redis.Redis.from_url(source.url, socket_timeout=30, **redis_options(source.access))
    try:
        for name, pattern, empty_key in shards:
            prefix = f"{source.key_prefix}:{source.pipeline_id}:s:{name}:".encode()
            batch: list[bytes] = [prefix] if empty_key else []
            for found in client.scan_iter(match=pattern, count=1000):
                batch.append(found)
                if len(batch) >= 1000:
                    yield from _mget(client, batch, len(prefix), name, stages, plain)
                    batch = []
            yield from _mget(client, batch, len(prefix), name, stages, plain)
    finally:
        client.close()


def _mget(client: Any, names: list[bytes], cut: int, stage_name: str, stages: Sequence[str],
          plain: Sequence[str]) -> Iterator[Row]:
    if not names:
        return
    for name, value in zip(names, client.mget(names), strict=True):
        if value is not None:
            yield from decode_row(stage_name, name[cut:].decode(), value, stages, plain)


def redis_windows(spark: Any, source: RedisSource, stages: Sequence[str], shards: int,
                  plain: Sequence[str] = ()) -> Any:
    """A DataFrame of every window of ``stages`` (and state of ``plain`` stages), SCANned
    by pattern shard in the executors."""
    patterns = redis_shard_patterns(source, [*stages, *plain], shards)
    rdd = spark.sparkContext.parallelize(patterns, min(len(patterns), shards * 2)).mapPartitions(
        lambda part: read_redis_shard(source, list(part), tuple(stages), tuple(plain)))
    return _prefer_history(spark.createDataFrame(rdd, window_schema()))


# --- landing zone ------------------------------------------------------------


def landing_windows(spark: Any, root: str, stages: Sequence[str]) -> Any:
    """Closed windows from the Parquet landing zone, one row per (stage, key, start)."""
    from pyspark.sql import functions as F

    frame = spark.read.option("basePath", root).parquet(*[f"{root}/stage={s}" for s in stages])
    rows = frame.select(
        F.col("stage").cast("string"), "key", "window_start", F.lit(True).alias("closed"),
        "value")
    return rows.dropDuplicates(["stage", "key", "window_start"])


def landing_states(spark: Any, root: str, stages: Sequence[str]) -> Any:
    """Non-windowed stages from the landing zone: each key's latest state (the highest
    progress, then the latest write; ``onceflow.analytics.landing``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    frame = spark.read.option("basePath", root).option("mergeSchema", "true").parquet(
        *[f"{root}/stage={s}" for s in stages])
    latest = Window.partitionBy("stage", "key").orderBy(F.col("progress").desc(),
                                                        F.col("written_ms").desc())
    return (frame.withColumn("_n", F.row_number().over(latest)).where(F.col("_n") == 1)
            .select(F.col("stage").cast("string"), "key", F.col("window_start"),
                    F.lit(False).alias("closed"), "value"))


def _prefer_history(frame: Any) -> Any:
    """Keep one row per window: the history row where a crash left both (equal) copies."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    first = Window.partitionBy("stage", "key", "window_start").orderBy(F.col("closed").desc())
    return (frame.withColumn("_n", F.row_number().over(first))
            .where(F.col("_n") == 1).drop("_n"))
