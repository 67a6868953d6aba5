"""``onceflow analytics``: the Spark batch job, or ``--follow`` the landing zone.

    onceflow analytics -c app.conf [--master local[*]|spark://host:7077]
        [--since T --until T] [--out DIR] [--source store|landing]
        [--follow [--once]] [--set KEY=VALUE ...]

The pipeline named by the configuration says which stages are windowed (the
finest window first) and where each one's store is; ``--source landing``
reads the Parquet landing zone (``onceflow.landing.dir``) instead of the
stores. ``T`` is epoch milliseconds or an ISO 8601 time (UTC unless it says
otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from onceflow.analytics.job import JobOptions, JobResult, run_job
from onceflow.analytics.session import build_session, spark_progress
from onceflow.runtime.config import ConfigError, Settings, load_settings
from onceflow.stages.pipeline import Pipeline

__all__ = ["cli", "parse_time", "run_analytics", "store_windows", "windowed_stages"]

EXIT_CONFIG = 2


def parse_time(text: str) -> int:
    """Epoch milliseconds from ``1767225600000`` or ``2026-01-01T00:00:00[Z|+01:00]``."""
    if text.strip().lstrip("-").isdigit():
        return int(text)
    moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def windowed_stages(pipeline: Pipeline) -> list[str]:
    """The windowed aggregates' ids, finest window first (pipeline order on ties)."""
    specs = [a for a in pipeline.aggregates if a.window is not None]
    specs.sort(key=lambda a: a.window.size_ms if a.window is not None else 0)
    return [a.id for a in specs]


def store_windows(spark: Any, settings: Settings, pipeline: Pipeline, stages: Sequence[str]
                  ) -> Any:
    """Every window of ``stages`` from the stores their aggregates name, read in executors."""
    from onceflow.analytics import readers

    by_store: dict[str, list[str]] = {}
    for spec in pipeline.aggregates:
        if spec.id in stages:
            by_store.setdefault(spec.store, []).append(spec.id)
    a = settings.analytics
    frames = []
    for store, ids in by_store.items():
        if store == "redis":
            r = settings.stores.redis
            source = readers.RedisSource(r.url, r.key_prefix, pipeline.id, r.access)
            frames.append(readers.redis_windows(spark, source, ids, a.redis_shards))
        else:
            c = settings.stores.cassandra
            cassandra = readers.CassandraSource(
                c.contact_points, c.port, c.keyspace, pipeline.id, c.protocol_version,
                c.local_datacenter, c.consistency, max(30.0, c.request_timeout), c.access)
            frames.append(readers.cassandra_windows(spark, cassandra, ids, a.cassandra_splits))
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    return frame


def run_analytics(settings: Settings, pipeline: Pipeline, *, out: Path,
                  source: str = "store", master: str | None = None,
                  since_ms: int | None = None, until_ms: int | None = None,
                  console: Console | None = None, spark: Any = None) -> JobResult:
    """Build (or reuse) the SparkSession and run the batch job; show progress."""
    from onceflow.analytics import readers

    console = console or Console(stderr=True)
    stages = windowed_stages(pipeline)
    if not stages:
        raise ConfigError(settings.source, "onceflow.pipeline",
                          f"pipeline {pipeline.id!r} has no windowed aggregate to analyse")
    if source == "landing" and settings.landing.dir is None:
        raise ConfigError(settings.source, "onceflow.landing.dir",
                          "expected a directory: --source landing reads the landing zone")
    spark = spark or build_session(settings.analytics.spark, master)
    a = settings.analytics
    where = (f"landing zone {settings.landing.dir}" if source == "landing"
             else f"stores of pipeline {pipeline.id!r}")
    options = JobOptions(stages, out, a.top_n, a.anomaly_k, a.min_events, since_ms, until_ms,
                         where)
    with spark_progress(spark, console, "analytics") as step:
        if source == "landing":
            assert settings.landing.dir is not None
            windows = readers.landing_windows(spark, settings.landing.dir, stages)
        else:
            windows = store_windows(spark, settings, pipeline, stages)
        return run_job(spark, windows, options, step)


def summary_table(result: JobResult) -> Table:
    table = Table(title="onceflow analytics")
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


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="onceflow analytics", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", required=True, help="application HOCON file")
    parser.add_argument("--master", help="Spark master (default onceflow.analytics.spark.master)")
    parser.add_argument("--since", type=parse_time, help="first window start (inclusive)")
    parser.add_argument("--until", type=parse_time, help="last window start (exclusive)")
    parser.add_argument("--out", type=Path,
                        help="output directory (default onceflow.analytics.out)")
    parser.add_argument("--source", choices=("store", "landing"), default="store")
    parser.add_argument("--follow", action="store_true",
                        help="stream fleet counters from the landing zone until interrupted")
    parser.add_argument("--once", action="store_true",
                        help="with --follow: process the files there now, then stop")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable)")
    args = parser.parse_args(argv)
    from onceflow.runtime.wiring import load_pipeline

    try:
        overrides = dict(_split(a) for a in args.set)
        settings = load_settings(args.config, overrides)
        pipeline = load_pipeline(settings)
    except (ConfigError, ValueError) as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    console = Console()
    out = args.out or Path(settings.analytics.out)
    if args.follow:
        return _follow(settings, pipeline, args.master, out, args.once, console)
    try:
        result = run_analytics(settings, pipeline, out=out, source=args.source,
                               master=args.master, since_ms=args.since, until_ms=args.until,
                               console=console)
    except ConfigError as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    console.print(summary_table(result))
    console.print(f"anomalies: {result.summary['anomalies']:,} "
                  f"(k = {settings.analytics.anomaly_k:g}); elapsed {result.elapsed:.1f} s")
    console.print(f"report: {result.report}", soft_wrap=True)
    for name, path in result.charts.items():
        console.print(f"chart {name}: {path}", soft_wrap=True)
    return 0


def _follow(settings: Settings, pipeline: Pipeline, master: str | None, out: Path, once: bool,
            console: Console) -> int:
    from onceflow.analytics.follow import follow_fleet

    if settings.landing.dir is None:
        print(f"onceflow: config error: {settings.source}: onceflow.landing.dir: expected a "
              "directory: --follow reads the landing zone", file=sys.stderr)
        return EXIT_CONFIG
    spark = build_session(settings.analytics.spark, master)

    def show(batch: int, counters: dict[str, dict[str, Any]]) -> None:
        console.print(f"batch {batch}: " + json.dumps(counters, sort_keys=True), soft_wrap=True)

    query = follow_fleet(spark, settings.landing.dir, windowed_stages(pipeline),
                         out / "follow-checkpoint", show, once=once)
    if not once:
        console.print(f"following {settings.landing.dir} (Ctrl-C to stop)")
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
    return 0


def _split(assignment: str) -> tuple[str, str]:
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise ValueError(f"--set expects KEY=VALUE, got {assignment!r}")
    return key.strip(), value
