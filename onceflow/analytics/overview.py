"""The generic report: what any pipeline's aggregates hold, without knowing its values.

Per stage, over the frames of :mod:`onceflow.analytics.frames` (one row per
key, or per key and window), it computes in Spark and writes under ``out``:

* ``tables/stages``: stage, windowed, keys (distinct), rows, windows
  (distinct starts), closed windows, numeric fields.
* ``tables/distributions``: per stage and numeric field: count, min, mean,
  max and the 25/50/75/95th percentiles (Spark's ``percentile_approx``,
  accuracy 10,000) of the field over the rows.
* ``tables/top_keys``: per stage and numeric field, the ``top-n`` keys by
  the field's total (summed over a key's windows; ties by key).
* ``tables/over_time``: per window start, the keys seen and each numeric
  field's total; for a non-windowed stage with a landing zone, the same per
  time bucket of its landed states (:mod:`onceflow.analytics.history`).
* charts and ``report.html`` (:mod:`onceflow.analytics.overview_report`),
  ``summary.json``.

Only those small results reach the driver. ``overview`` has the signature of
a ``--job`` function and is what ``onceflow analytics`` runs without one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow.analytics.frames import numeric_fields
from onceflow.analytics.history import states_over_time
from onceflow.runtime.settings import Settings

__all__ = ["QUANTILES", "OverviewResult", "overview"]

QUANTILES = (0.25, 0.5, 0.75, 0.95)
Rows = list[dict[str, Any]]


@dataclass
class OverviewResult:
    out: Path
    tables: dict[str, Path] = field(default_factory=dict)
    charts: dict[str, Path] = field(default_factory=dict)
    report: Path | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    elapsed: float = 0.0


def overview(spark: Any, frames: Mapping[str, Any], out: Path, settings: Settings,
             step: Callable[[str], None] = lambda name: None) -> OverviewResult:
    """Compute the tables, draw the charts, write the report (module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from onceflow.analytics import overview_report

    started = time.monotonic()
    result = OverviewResult(out)
    tables: dict[str, Rows] = {"stages": [], "distributions": [], "top_keys": [],
                               "over_time": []}
    for stage, frame in frames.items():
        step(f"summarising {stage}")
        fields = numeric_fields(frame)
        windowed = "window_start" in frame.columns
        frame = frame.persist()
        tables["stages"].append({"stage": stage, "windowed": windowed, **_counts(frame, windowed),
                                 "fields": ",".join(fields)})
        tables["distributions"] += _distributions(frame, stage, fields)
        tables["top_keys"] += _top_keys(frame, stage, fields, settings.analytics.top_n)
        if windowed:
            tables["over_time"] += _over_time(frame, stage, fields)
        elif settings.landing.dir is not None:  # the states its flushes landed
            tables["over_time"] += states_over_time(spark, settings.landing.dir, stage, fields)
        frame.unpersist()
    step("writing tables")
    for name, rows in tables.items():
        path = out / "tables" / f"{name}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), path)
        result.tables[name] = path
    pipeline = next((f.first()["pipeline"] for f in frames.values() if not f.isEmpty()), "")
    result.summary = {"pipeline": pipeline, "top_n": settings.analytics.top_n,
                      "stages": {r["stage"]: {k: v for k, v in r.items() if k != "stage"}
                                 for r in tables["stages"]}}
    step("drawing charts")
    result.charts = overview_report.draw_charts(tables, out / "charts")
    result.report = overview_report.write_html(out / "report.html", result.summary, tables,
                                               result.charts, result.tables)
    result.elapsed = time.monotonic() - started
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
    return result


def _counts(frame: Any, windowed: bool) -> dict[str, int]:
    from pyspark.sql import functions as F

    aggs = [F.countDistinct("key").alias("keys"), F.count("*").alias("rows")]
    if windowed:
        aggs += [F.countDistinct("window_start").alias("windows"),
                 F.sum(F.col("closed").cast("long")).alias("closed")]
    row = frame.agg(*aggs).first().asDict()
    return {"keys": row["keys"], "rows": row["rows"], "windows": row.get("windows") or 0,
            "closed": row.get("closed") or 0}


def _distributions(frame: Any, stage: str, fields: list[str]) -> Rows:
    from pyspark.sql import functions as F

    if not fields:
        return []
    aggs = []
    for i, name in enumerate(fields):
        column = F.col(f"`{name}`")
        aggs += [F.count(column).alias(f"n{i}"), F.min(column).alias(f"lo{i}"),
                 F.avg(column).alias(f"mean{i}"), F.max(column).alias(f"hi{i}"),
                 F.percentile_approx(column, list(QUANTILES), 10_000).alias(f"q{i}")]
    row = frame.agg(*aggs).first()
    rows = []
    for i, name in enumerate(fields):
        quantiles = row[f"q{i}"] or [None] * len(QUANTILES)
        rows.append({"stage": stage, "field": name, "count": row[f"n{i}"],
                     "min": _number(row[f"lo{i}"]), "mean": _number(row[f"mean{i}"]),
                     "max": _number(row[f"hi{i}"]),
                     **{f"p{round(q * 100)}": _number(v)
                        for q, v in zip(QUANTILES, quantiles, strict=True)}})
    return rows


def _top_keys(frame: Any, stage: str, fields: list[str], top_n: int) -> Rows:
    from pyspark.sql import functions as F

    rows = []
    for name in fields:
        per_key = (frame.groupBy("key")
                   .agg(F.sum(F.col(f"`{name}`")).alias("total"), F.count("*").alias("rows"))
                   .where(F.col("total").isNotNull())
                   .orderBy(F.col("total").desc(), F.col("key").asc()).limit(top_n))
        rows += [{"stage": stage, "field": name, "rank": rank, "key": r["key"],
                  "total": _number(r["total"]), "rows": r["rows"]}
                 for rank, r in enumerate(per_key.collect(), start=1)]
    return rows


def _over_time(frame: Any, stage: str, fields: list[str]) -> Rows:
    from pyspark.sql import functions as F

    aggs = [F.countDistinct("key").alias("keys"),
            *[F.sum(F.col(f"`{name}`")).alias(f"s{i}") for i, name in enumerate(fields)]]
    rows = []
    for r in frame.groupBy("window_start", "window_end").agg(*aggs).orderBy(
            "window_start").collect():
        base = {"stage": stage, "window_start": r["window_start"],
                "window_end": r["window_end"], "keys": r["keys"]}
        rows += ([{**base, "field": name, "total": _number(r[f"s{i}"])}
                  for i, name in enumerate(fields)]
                 or [{**base, "field": None, "total": None}])
    return rows


def _number(value: Any) -> float | None:
    """One numeric type for the tables (fields of one stage may be long or double)."""
    return None if value is None else float(value)
