"""The robots report, an ``onceflow analytics --job`` example: rates, top failing, trend,
anomalies over the robot workload's windows.

    onceflow analytics -c app.conf --job onceflow.examples.robots_report:report

``report`` is the job function: it takes the windowed stages' frames (values
``{"ok": n, "failed": n}``, finest window first) and hands them to
``run_job``, whose input is the raw rows of :mod:`onceflow.analytics.readers`
(stage, key, window_start, closed, value JSON). Output, under ``out``:

* ``tables/robot_windows``: stage, robot, window_start, closed, ok, failed,
  total, failure_rate (failed / total), for every window of every stage.
* ``tables/fleet_windows``: stage, window_start, robots, ok, failed, total,
  failure_rate (the fleet's pooled rate in that window).
* ``tables/top_failing``: the ``top_n`` robots with the most failures in the
  first (finest) stage's windows (ties by robot id), with rank and rate.
* ``tables/hourly_trend``: the finest stage summed per UTC hour.
* ``tables/window_stats`` and ``tables/anomalies``: per window of the finest
  stage, the mean and (population) standard deviation of the failure rates
  of the robots with at least ``min_events`` events there; a robot is an
  anomaly when its rate is more than ``k`` deviations above that mean
  (``z = (rate - mean) / std > k``, windows with ``std = 0`` have none).
* PNG charts and ``report.html`` (see :mod:`onceflow.examples.robots_charts`),
  ``summary.json``.

``since``/``until`` keep windows with ``since <= window_start < until``.
Everything is computed by Spark; the driver collects only the small
per-window, per-hour and top-N results for the charts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow.analytics.overview import OverviewResult
from onceflow.runtime.settings import Settings

__all__ = ["HOUR_MS", "JobOptions", "JobResult", "report", "run_job", "summary_table"]

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class JobOptions:
    stages: Sequence[str]  # windowed stages; the first is the finest (top, trend, anomalies)
    out: Path
    top_n: int = 10
    anomaly_k: float = 2.0
    min_events: int = 3
    since_ms: int | None = None
    until_ms: int | None = None
    source: str = ""  # for the report: where the windows came from


#: What the job wrote: the same record as the generic report's.
JobResult = OverviewResult


def robot_counts(windows: Any) -> Any:
    """(stage, key, window_start, closed, value JSON) -> (stage, robot, ..., ok, failed, ...)."""
    from pyspark.sql import functions as F

    ok = F.coalesce(F.get_json_object("value", "$.ok").cast("long"), F.lit(0))
    failed = F.coalesce(F.get_json_object("value", "$.failed").cast("long"), F.lit(0))
    return (windows
            .select("stage", F.col("key").alias("robot"), "window_start", "closed",
                    ok.alias("ok"), failed.alias("failed"))
            .withColumn("total", F.col("ok") + F.col("failed"))
            .withColumn("failure_rate", _rate("failed", "total")))


def _rate(failed: str, total: str) -> Any:
    from pyspark.sql import functions as F

    return F.when(F.col(total) > 0, F.col(failed) / F.col(total)).otherwise(F.lit(0.0))


def run_job(spark: Any, windows: Any, options: JobOptions,
            step: Callable[[str], None] = lambda name: None) -> JobResult:
    """Compute every table, write them as Parquet, draw the charts, write the report."""
    from pyspark.sql import functions as F

    from onceflow.examples import robots_charts

    started = time.monotonic()
    out = options.out
    result = JobResult(out)
    tables = out / "tables"
    fine_stage = options.stages[0]

    step("reading windows")
    robots = robot_counts(windows)
    if options.since_ms is not None:
        robots = robots.where(F.col("window_start") >= options.since_ms)
    if options.until_ms is not None:
        robots = robots.where(F.col("window_start") < options.until_ms)
    robots = robots.persist()
    robots.count()

    fleet = (robots.groupBy("stage", "window_start")
             .agg(F.count("*").alias("robots"), F.sum("ok").alias("ok"),
                  F.sum("failed").alias("failed"))
             .withColumn("total", F.col("ok") + F.col("failed"))
             .withColumn("failure_rate", _rate("failed", "total")))
    fine = robots.where(F.col("stage") == fine_stage)
    top = (fine.groupBy("robot")
           .agg(F.sum("ok").alias("ok"), F.sum("failed").alias("failed"),
                F.count("*").alias("windows"))
           .withColumn("total", F.col("ok") + F.col("failed"))
           .withColumn("failure_rate", _rate("failed", "total"))
           .orderBy(F.col("failed").desc(), F.col("robot").asc())
           .limit(options.top_n))
    hourly = (fine.withColumn("hour_start", F.col("window_start")
                              - F.pmod(F.col("window_start"), F.lit(HOUR_MS)))
              .groupBy("hour_start")
              .agg(F.countDistinct("robot").alias("robots"), F.sum("ok").alias("ok"),
                   F.sum("failed").alias("failed"))
              .withColumn("total", F.col("ok") + F.col("failed"))
              .withColumn("failure_rate", _rate("failed", "total")))
    qualified = fine.where(F.col("total") >= options.min_events)
    stats = (qualified.groupBy("window_start")
             .agg(F.count("*").alias("robots"), F.avg("failure_rate").alias("mean_rate"),
                  F.stddev_pop("failure_rate").alias("std_rate")))
    anomalies = (qualified.join(stats.select("window_start", "mean_rate", "std_rate"),
                                "window_start")
                 .where(F.col("std_rate") > 0)
                 .withColumn("z", (F.col("failure_rate") - F.col("mean_rate"))
                             / F.col("std_rate"))
                 .where(F.col("z") > options.anomaly_k)
                 .select("window_start", "robot", "ok", "failed", "total", "failure_rate",
                         "mean_rate", "std_rate", "z"))

    outputs = {
        "robot_windows": robots.orderBy("stage", "window_start", "robot"),
        "fleet_windows": fleet.orderBy("stage", "window_start"),
        "top_failing": top,
        "hourly_trend": hourly.orderBy("hour_start"),
        "window_stats": stats.orderBy("window_start"),
        "anomalies": anomalies.orderBy("window_start", F.col("z").desc(), "robot"),
    }
    for name, frame in outputs.items():
        step(f"writing {name}")
        path = tables / name
        small = name != "robot_windows"
        (frame.coalesce(1) if small else frame).write.mode("overwrite").parquet(str(path))
        result.tables[name] = path

    step("collecting results for the charts")
    collected = {name: [row.asDict() for row in spark.read.parquet(str(path)).collect()]
                 for name, path in result.tables.items() if name != "robot_windows"}
    collected["top_failing"].sort(key=lambda r: (-r["failed"], r["robot"]))
    per_stage = (robots.groupBy("stage")
                 .agg(F.countDistinct("robot").alias("robots"), F.count("*").alias("windows"),
                      F.sum(F.col("closed").cast("long")).alias("closed_windows"),
                      F.sum("ok").alias("ok"), F.sum("failed").alias("failed"))
                 .collect())
    robots.unpersist()
    result.summary = {
        "source": options.source,
        "since_ms": options.since_ms,
        "until_ms": options.until_ms,
        "anomaly_k": options.anomaly_k,
        "min_events": options.min_events,
        "top_n": options.top_n,
        "fine_stage": fine_stage,
        "stages": {row["stage"]: {k: row[k] for k in
                                  ("robots", "windows", "closed_windows", "ok", "failed")}
                   for row in per_stage},
        "anomalies": len(collected["anomalies"]),
    }
    step("drawing charts")
    result.charts = robots_charts.draw_charts(collected, fine_stage, options.anomaly_k,
                                              out / "charts")
    result.report = robots_charts.write_html(out / "report.html", result.summary, collected,
                                             result.charts, result.tables)
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
    result.elapsed = time.monotonic() - started
    result.summary["elapsed_s"] = round(result.elapsed, 1)
    return result


def report(spark: Any, frames: Mapping[str, Any], out: Path, settings: Settings) -> JobResult:
    """The ``--job`` entry: every windowed frame, finest window first, through ``run_job``."""
    from pyspark.sql import functions as F

    sizes = {}
    for stage, frame in frames.items():
        if "window_start" in frame.columns:
            first = frame.select((F.col("window_end") - F.col("window_start")).alias("n")).first()
            sizes[stage] = first["n"] if first is not None else 2**62
    if not sizes:
        raise ValueError("the robots report needs a windowed aggregate")
    stages = sorted(sizes, key=lambda s: sizes[s])
    windows = frames[stages[0]]
    for stage in stages[1:]:
        windows = windows.unionByName(frames[stage])
    windows = windows.select("stage", "key", "window_start", "closed",
                             F.col("value_json").alias("value"))
    a = settings.analytics
    options = JobOptions(stages, out, a.top_n, a.anomaly_k, a.min_events,
                         source=f"the stores named in {settings.source}")
    return run_job(spark, windows, options)


def summary_table(result: JobResult) -> Any:
    """A rich table of the per-stage totals (for ``make demo``)."""
    from rich.table import Table

    table = Table(title="onceflow analytics: robots report")
    width = max([len(stage) for stage in result.summary["stages"]] + [5])
    table.add_column("stage", no_wrap=True, min_width=width)
    for column in ("robots", "windows", "closed", "ok", "failed", "failed %"):
        table.add_column(column, justify="right")
    for stage, v in result.summary["stages"].items():
        total = v["ok"] + v["failed"]
        table.add_row(stage, f"{v['robots']:,}", f"{v['windows']:,}", f"{v['closed_windows']:,}",
                      f"{v['ok']:,}", f"{v['failed']:,}",
                      f"{100 * v['failed'] / total:.2f}" if total else "-")
    return table
