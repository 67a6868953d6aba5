"""Any aggregate as a Spark DataFrame: windowed or not, typed when its values allow.

``states(spark, settings, stage)`` gives one stage; ``read_frames`` gives every
stage of a pipeline at once (one read per store), which is what user jobs
get. Columns:

* ``pipeline``, ``stage``, ``key``;
* windowed aggregates only: ``window_start``, ``window_end`` (epoch ms) and
  ``closed`` (a history row, final; or a window still open in its key's state);
* ``value_json``: the value (the state, or the window's value) as JSON;
* typed columns: of the type the aggregate declares (``schema=``, see
  :mod:`onceflow.analytics.schemas`), else inferred from the values. One
  column per field of a struct (a field named like a column above gets a
  ``value_`` prefix), ``value`` for anything else. Inference only types a
  flat JSON object of numbers, strings and booleans, or a number or string;
  other values get ``value_json`` only.

Inference is Spark's JSON schema inference over the values, run in the
executors like the reads (:mod:`onceflow.analytics.readers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onceflow.analytics.readers import (
    CassandraSource,
    RedisSource,
    cassandra_windows,
    landing_states,
    landing_windows,
    redis_windows,
    window_schema,
)
from onceflow.runtime.config import ConfigError, Settings
from onceflow.stages.pipeline import Pipeline

__all__ = [
    "BASE_COLUMNS",
    "landing_stages",
    "numeric_fields",
    "raw_states",
    "read_frames",
    "stage_windows",
    "states",
    "store_windows",
    "typed",
    "windowed_stages",
]

BASE_COLUMNS = ("pipeline", "stage", "key", "window_start", "window_end", "closed", "value_json")


def stage_windows(pipeline: Pipeline) -> dict[str, int | None]:
    """Each aggregate's id -> its window size in ms (None: not windowed), pipeline order."""
    return {a.id: (a.window.size_ms if a.window is not None else None)
            for a in pipeline.aggregates}


def windowed_stages(pipeline: Pipeline) -> list[str]:
    """The windowed aggregates' ids, finest window first (pipeline order on ties)."""
    sizes = {s: n for s, n in stage_windows(pipeline).items() if n is not None}
    return sorted(sizes, key=lambda s: sizes[s])


def landing_stages(settings: Settings, pipeline: Pipeline) -> tuple[list[str], list[str]]:
    """What ``--source landing`` reads: (the aggregates with files in the landing zone,
    windowed or not, in pipeline order; those without, which it leaves out). Without a
    landing directory every aggregate is "read" (``raw_states`` then names the key)."""
    ids = [spec.id for spec in pipeline.aggregates]
    if settings.landing.dir is None:
        return ids, []
    root = Path(settings.landing.dir)
    found = [s for s in ids if (root / f"stage={s}").is_dir()]
    return found, [s for s in ids if s not in found]


def store_windows(spark: Any, settings: Settings, pipeline: Pipeline, stages: Sequence[str],
                  plain: Sequence[str] = ()) -> Any:
    """Raw rows of ``stages`` (windowed) and ``plain`` (not) from the stores their
    aggregates name, read in executors: (stage, key, window_start, closed, value)."""
    by_store: dict[str, tuple[list[str], list[str]]] = {}
    for spec in pipeline.aggregates:
        if spec.id in stages or spec.id in plain:
            kinds = by_store.setdefault(spec.store, ([], []))
            kinds[0 if spec.id in stages else 1].append(spec.id)
    a = settings.analytics
    frames = []
    for store, (windowed, flat) in by_store.items():
        if store == "redis":
            r = settings.stores.redis
            source = RedisSource(r.url, r.key_prefix, pipeline.id, r.access)
            frames.append(redis_windows(spark, source, windowed, a.redis_shards, flat))
        else:
            c = settings.stores.cassandra
            cassandra = CassandraSource(
                c.contact_points, c.port, c.keyspace, pipeline.id, c.protocol_version,
                c.local_datacenter, c.consistency, max(30.0, c.request_timeout), c.access)
            frames.append(cassandra_windows(spark, cassandra, windowed,
                                                    a.cassandra_splits, flat))
    if not frames:
        return spark.createDataFrame([], window_schema())
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    return frame


def raw_states(spark: Any, settings: Settings, pipeline: Pipeline, stages: Sequence[str],
               source: str = "store") -> Any:
    """The raw rows of ``stages`` from the stores or the landing zone (closed windows, and
    the latest state of each key of a non-windowed stage)."""
    sizes = stage_windows(pipeline)
    unknown = [s for s in stages if s not in sizes]
    if unknown:
        raise ConfigError(settings.source, "onceflow.pipeline",
                          f"pipeline {pipeline.id!r} has no aggregate {unknown[0]!r} "
                          f"(it has {', '.join(sizes) or 'none'})")
    windowed = [s for s in stages if sizes[s] is not None]
    plain = [s for s in stages if sizes[s] is None]
    if source != "landing":
        return store_windows(spark, settings, pipeline, windowed, plain)
    if settings.landing.dir is None:
        raise ConfigError(settings.source, "onceflow.landing.dir",
                          "expected a directory: --source landing reads the landing zone")
    root = settings.landing.dir
    missing = [s for s in plain if not (Path(root) / f"stage={s}").is_dir()]
    if missing:
        raise ConfigError(settings.source, "onceflow.landing.dir",
                          f"no landing files of stage {missing[0]!r} in {root}: the landing zone "
                          "holds what workers wrote with it on; read it with --source store")
    frames = ([landing_windows(spark, root, windowed)] if windowed else []) + (
        [landing_states(spark, root, plain)] if plain else [])
    return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])


def read_frames(spark: Any, settings: Settings, pipeline: Pipeline,
                stages: Sequence[str] | None = None, *, source: str = "store",
                since_ms: int | None = None, until_ms: int | None = None) -> dict[str, Any]:
    """Stage id -> its DataFrame (module docstring), every aggregate in pipeline order
    unless ``stages`` names some. ``since_ms``/``until_ms`` keep windows with
    ``since <= window_start < until``; they leave non-windowed stages whole."""
    from pyspark.sql import functions as F

    sizes = stage_windows(pipeline)
    schemas = {spec.id: spec.schema for spec in pipeline.aggregates}
    wanted = list(stages) if stages is not None else list(sizes)
    raw = raw_states(spark, settings, pipeline, wanted, source).persist()
    frames = {}
    for stage in wanted:
        rows = raw.where(F.col("stage") == stage)
        size = sizes[stage]
        if size is None:
            frame = rows.select(F.lit(pipeline.id).alias("pipeline"), "stage", "key",
                                F.col("value").alias("value_json"))
        else:
            if since_ms is not None:
                rows = rows.where(F.col("window_start") >= since_ms)
            if until_ms is not None:
                rows = rows.where(F.col("window_start") < until_ms)
            frame = rows.select(F.lit(pipeline.id).alias("pipeline"), "stage", "key",
                                "window_start", (F.col("window_start") + size).alias("window_end"),
                                "closed", F.col("value").alias("value_json"))
        frames[stage] = typed(spark, frame, schemas[stage])
    return frames


def states(spark: Any, settings: Settings, stage: str, *, pipeline: Pipeline | None = None,
           source: str = "store") -> Any:
    """One aggregate stage as a DataFrame; the pipeline is the configured one by default."""
    if pipeline is None:
        from onceflow.runtime.wiring import load_pipeline

        pipeline = load_pipeline(settings)
    return read_frames(spark, settings, pipeline, [stage], source=source)[stage]


def typed(spark: Any, frame: Any, declared: Any = None) -> Any:
    """``frame`` plus typed columns for its ``value_json`` (module docstring): of the
    ``declared`` type (``onceflow.analytics.schemas``) if any, else inferred."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import AtomicType, StructField, StructType

    from onceflow.analytics.schemas import spark_type

    wrapped = F.concat(F.lit('{"value":'), F.col("value_json"), F.lit("}"))
    if declared is not None:
        kind = spark_type(declared)
    else:
        texts = frame.select(wrapped.alias("j")).rdd.map(lambda row: row[0])
        inferred = spark.read.json(texts).schema
        if [f.name for f in inferred.fields] != ["value"]:  # empty, or _corrupt_record
            return frame
        kind = inferred["value"].dataType
        if isinstance(kind, StructType) and not all(
                isinstance(f.dataType, AtomicType) for f in kind.fields):
            return frame
        if not isinstance(kind, AtomicType | StructType):
            return frame
    parsed = F.from_json(wrapped, StructType([StructField("value", kind)]))["value"]
    if not isinstance(kind, StructType):
        return frame.withColumn("value", parsed)
    taken = set(BASE_COLUMNS) | {"value"}
    return frame.select("*", *[parsed[f.name].alias(
        f"value_{f.name}" if f.name in taken else f.name) for f in kind.fields])


def numeric_fields(frame: Any) -> list[str]:
    """The typed columns of a frame that hold numbers (booleans excluded)."""
    from pyspark.sql.types import NumericType

    base = set(BASE_COLUMNS)
    return [f.name for f in frame.schema.fields
            if f.name not in base and isinstance(f.dataType, NumericType)]
