"""``onceflow analytics --follow``: per-stage counters kept current from the landing zone.

A Spark Structured Streaming query over the landing zone's Parquet files
(the file source picks up each new file once: files appear whole, by
rename). For any stage, the counters are: ``rows`` (closed windows, or keys
of a non-windowed stage), ``keys_approx`` (streaming has no exact distinct
count) and ``sums``, the total of every numeric field of the values (a
value that is a number is the field ``value``; strings, booleans and nested
objects are not summed). When a stage's values have ``ok`` and ``failed``
(the robots), ``failure_rate`` is added.

Windowed stages are streamed: rows are deduplicated on (stage, key,
window_start), so a window whose closing was replayed into a second file
counts once. A non-windowed stage's rows are successive states of its keys,
which a sum over the stream would count many times: at each trigger its
counters are computed from each key's latest row (``readers.landing_states``),
a batch read of that stage's files. Each trigger hands the complete current
counters to ``on_update``; the query's checkpoint makes a restarted
follower continue where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["StageCounters", "follow_stages", "landing_stream_schema", "numeric_pairs"]

StageCounters = dict[str, dict[str, Any]]  # stage -> rows, keys_approx, sums[, failure_rate]
ROWS = "#rows"  # the pseudo-field counting rows in ``numeric_pairs``


def landing_stream_schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType([
        StructField("pipeline", StringType()),
        StructField("key", StringType()),
        StructField("window_start", LongType()),
        StructField("value", StringType()),
        StructField("progress", LongType()),
        StructField("written_ms", LongType()),
        StructField("stage", StringType()),  # from the stage=<id> directory
    ])


def numeric_pairs(frame: Any, keep: Sequence[str] = ()) -> Any:
    """(stage, key, *keep, field, number) for every numeric top-level field of each row's
    value, plus one (stage, key, *keep, ``#rows``, 1.0) per row."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType, StringType

    scalar = F.col("value").try_cast("double")
    fields = F.from_json("value", MapType(StringType(), StringType()))
    pairs = F.when(scalar.isNotNull(), F.array(F.struct(
        F.lit("value").alias("field"), scalar.alias("number")))).otherwise(
        F.transform(F.map_entries(F.coalesce(fields, F.create_map())), lambda e: F.struct(
            e["key"].alias("field"), e["value"].try_cast("double").alias("number"))))
    marker = F.array(F.struct(F.lit(ROWS).alias("field"), F.lit(1.0).alias("number")))
    exploded = frame.select("stage", "key", *keep,
                            F.explode(F.concat(marker, pairs)).alias("p"))
    return (exploded.select("stage", "key", *keep, F.col("p.field").alias("field"),
                            F.col("p.number").alias("number"))
            .where(F.col("number").isNotNull()))


def _summed(pairs: Any) -> Any:
    from pyspark.sql import functions as F

    return pairs.groupBy("stage", "field").agg(
        F.sum("number").alias("total"), F.approx_count_distinct("key").alias("keys"))


def _counters(rows: list[Any]) -> StageCounters:
    current: StageCounters = {}
    for row in rows:
        stage = current.setdefault(row["stage"], {"rows": 0, "keys_approx": 0, "sums": {}})
        if row["field"] == ROWS:
            stage["rows"], stage["keys_approx"] = int(row["total"]), int(row["keys"])
        else:
            total = row["total"]
            stage["sums"][row["field"]] = int(total) if float(total).is_integer() else total
    for stage in current.values():
        sums = stage["sums"]
        if "ok" in sums and "failed" in sums:
            done = sums["ok"] + sums["failed"]
            stage["failure_rate"] = sums["failed"] / done if done else 0.0
    return current


def follow_stages(spark: Any, root: str | Path, windowed: Sequence[str], plain: Sequence[str],
                  checkpoint: str | Path, on_update: Callable[[int, StageCounters], None], *,
                  once: bool = False, interval_s: float = 5.0) -> Any:
    """Start the streaming query; with ``once`` process what is there now, then stop.

    Returns the StreamingQuery (already finished when ``once``).
    """
    from pyspark.sql import functions as F

    from onceflow.analytics.readers import landing_states

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = (spark.readStream.schema(landing_stream_schema())
            .option("basePath", str(root)).parquet(str(root))
            .where(F.col("stage").isin(list(windowed)))
            .dropDuplicates(["stage", "key", "window_start"]))
    streamed = _summed(numeric_pairs(rows))

    def each_batch(frame: Any, batch_id: int) -> None:
        found = frame.collect()
        present = [s for s in plain if (root / f"stage={s}").is_dir()]
        if present:  # each key's latest state, read again at each trigger
            latest = landing_states(spark, str(root), present)
            found += _summed(numeric_pairs(latest)).collect()
        on_update(batch_id, _counters(found))

    writer = (streamed.writeStream.outputMode("complete").foreachBatch(each_batch)
              .option("checkpointLocation", str(checkpoint)))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(
        processingTime=f"{interval_s} seconds")
    query = writer.start()
    if once:
        query.awaitTermination()
    return query
