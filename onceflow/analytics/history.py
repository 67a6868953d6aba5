"""A non-windowed stage over time, from the states its flushes landed.

The landing zone holds each flush's states of a non-windowed stage
(``onceflow.analytics.landing``). Ordered by progress, a key's rows are its
successive states; the difference between consecutive rows is what the key
gained in between. Summed per time bucket of ``written_ms`` and accumulated
over the buckets, those differences give each numeric field's total over
all keys as of each bucket's end, and each key's first row counts it among
the keys seen so far. These are the ``over_time`` rows of the generic report
for stages without windows (``window_start``/``window_end`` are the bucket).
Only the small per-bucket sums reach the driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["BUCKETS", "states_over_time"]

#: About how many time buckets a stage's history is cut into (each at least 1 s).
BUCKETS = 60


def states_over_time(spark: Any, root: str | Path, stage: str, fields: list[str]
                     ) -> list[dict[str, Any]]:
    """Per bucket and field: keys seen and the field's total (module docstring); [] when
    the landing zone holds no states of ``stage``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from onceflow.analytics.follow import ROWS, numeric_pairs

    folder = Path(root) / f"stage={stage}"
    if not folder.is_dir():
        return []
    rows = spark.read.option("mergeSchema", "true").parquet(str(folder))
    if "progress" not in rows.columns:  # a windowed stage's files
        return []
    span = rows.agg(F.min("written_ms").alias("lo"), F.max("written_ms").alias("hi")).first()
    if span is None or span["lo"] is None:
        return []
    size = max(1000, -(-(span["hi"] - span["lo"] + 1) // BUCKETS))
    pairs = numeric_pairs(rows.withColumn("stage", F.lit(stage)), keep=("progress", "written_ms"))
    before = F.lag("number").over(
        Window.partitionBy("key", "field").orderBy("progress", "written_ms"))
    gains = (pairs.withColumn("gain", F.col("number") - F.coalesce(before, F.lit(0.0)))
             .withColumn("bucket", F.floor(F.col("written_ms") / size) * size)
             .groupBy("bucket", "field").agg(F.sum("gain").alias("gain")))
    per_bucket: dict[int, dict[str, float]] = {}
    for r in gains.collect():
        per_bucket.setdefault(int(r["bucket"]), {})[r["field"]] = r["gain"]
    totals = dict.fromkeys([ROWS, *fields], 0.0)
    out: list[dict[str, Any]] = []
    for bucket in sorted(per_bucket):
        for name, gain in per_bucket[bucket].items():
            if name in totals:
                totals[name] += gain
        base = {"stage": stage, "window_start": bucket, "window_end": bucket + size,
                "keys": int(totals[ROWS])}
        out += ([{**base, "field": name, "total": totals[name]} for name in fields]
                or [{**base, "field": None, "total": None}])
    return out
