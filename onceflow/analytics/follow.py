"""``onceflow analytics --follow``: fleet counters kept current from the landing zone.

A Spark Structured Streaming query over the landing zone's Parquet files
(the file source picks up each new file once: files appear whole, by
rename). Rows are deduplicated on (stage, key, window_start), so a window
whose closing was replayed into a second file counts once, and summed per
stage: closed windows, robots (approximate: streaming has no exact
distinct count), ok, failed, failure rate. Each trigger hands
the complete current counters to ``on_update``; the query's checkpoint
makes a restarted follower continue where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["FleetCounters", "follow_fleet", "landing_stream_schema"]

FleetCounters = dict[str, dict[str, Any]]  # stage -> windows, robots_approx, ok, failed, rate


def landing_stream_schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType([
        StructField("pipeline", StringType()),
        StructField("key", StringType()),
        StructField("window_start", LongType()),
        StructField("value", StringType()),
        StructField("stage", StringType()),  # from the stage=<id> directory
    ])


def follow_fleet(spark: Any, root: str | Path, stages: Sequence[str], checkpoint: str | Path,
                 on_update: Callable[[int, FleetCounters], None], *, once: bool = False,
                 interval_s: float = 5.0) -> Any:
    """Start the streaming query; with ``once`` process what is there now, then stop.

    Returns the StreamingQuery (already finished when ``once``).
    """
    from pyspark.sql import functions as F

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = (spark.readStream.schema(landing_stream_schema())
            .option("basePath", str(root)).parquet(str(root))
            .where(F.col("stage").isin(list(stages)))
            .dropDuplicates(["stage", "key", "window_start"]))
    ok = F.coalesce(F.get_json_object("value", "$.ok").cast("long"), F.lit(0))
    failed = F.coalesce(F.get_json_object("value", "$.failed").cast("long"), F.lit(0))
    counters = (rows.groupBy("stage")
                .agg(F.count("*").alias("windows"),
                     F.approx_count_distinct("key").alias("robots_approx"),
                     F.sum(ok).alias("ok"), F.sum(failed).alias("failed")))

    def each_batch(frame: Any, batch_id: int) -> None:
        current: FleetCounters = {}
        for row in frame.collect():
            values: Mapping[str, Any] = row.asDict()
            total = values["ok"] + values["failed"]
            current[values["stage"]] = {
                "windows": values["windows"], "robots_approx": values["robots_approx"],
                "ok": values["ok"], "failed": values["failed"],
                "failure_rate": values["failed"] / total if total else 0.0,
            }
        on_update(batch_id, current)

    writer = (counters.writeStream.outputMode("complete").foreachBatch(each_batch)
              .option("checkpointLocation", str(checkpoint)))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(
        processingTime=f"{interval_s} seconds")
    query = writer.start()
    if once:
        query.awaitTermination()
    return query
