"""``onceflow analytics``: the generic report, a user's ``--job``, or ``--follow``.

    onceflow analytics -c app.conf [--job module:function] [--master local[*]|spark://host:7077]
        [--since T --until T] [--out DIR] [--source store|landing]
        [--follow [--once]] [--set KEY=VALUE ...]

Every aggregate of the pipeline named by the configuration is read as a
DataFrame (:mod:`onceflow.analytics.frames`) from its store, or with
``--source landing`` from the Parquet landing zone (``onceflow.landing.dir``:
closed windows, and each key's latest state of a non-windowed aggregate; an
aggregate with no files there is left out, named on stderr). Without ``--job`` the generic report
(:mod:`onceflow.analytics.overview`) runs over them; ``--job`` runs a user's
function instead (:mod:`onceflow.analytics.user_job`). ``T`` is epoch
milliseconds or an ISO 8601 time (UTC unless it says otherwise); it keeps
windows whose start is in ``[since, until)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from onceflow.analytics.executors import NoExecutors
from onceflow.analytics.frames import landing_stages, read_frames, windowed_stages
from onceflow.analytics.overview import OverviewResult, overview
from onceflow.analytics.session import build_session, spark_progress
from onceflow.analytics.user_job import Job, load_job
from onceflow.runtime.config import ConfigError, Settings, load_settings, split_assignment
from onceflow.stages.pipeline import Pipeline

__all__ = ["cli", "parse_time", "run_analytics", "summary_table"]

EXIT_CONFIG = 2
EXIT_FAILED = 1  # e.g. the cluster gave no executor (onceflow.analytics.spark.executor-wait)


def parse_time(text: str) -> int:
    """Epoch milliseconds from ``1767225600000`` or ``2026-01-01T00:00:00[Z|+01:00]``."""
    if text.strip().lstrip("-").isdigit():
        return int(text)
    moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def run_analytics(settings: Settings, pipeline: Pipeline, *, out: Path,
                  source: str = "store", master: str | None = None,
                  since_ms: int | None = None, until_ms: int | None = None,
                  console: Console | None = None, spark: Any = None,
                  job: Job | None = None) -> Any:
    """Build (or reuse) the SparkSession, read every aggregate, run ``job`` (default: the
    generic report) and return what it returns; show progress meanwhile."""
    console = console or Console(stderr=True)
    if not pipeline.aggregates:
        raise ConfigError(settings.source, "onceflow.pipeline",
                          f"pipeline {pipeline.id!r} has no aggregate to analyse")
    stages = None
    if source == "landing":
        stages, left_out = landing_stages(settings, pipeline)
        if not stages:
            raise ConfigError(settings.source, "onceflow.landing.dir",
                              f"no landing files of any aggregate of {pipeline.id!r} in "
                              f"{settings.landing.dir}: read the stores with --source store")
        for stage in left_out:
            print(f"onceflow: --source landing leaves out {stage!r}: no landing files of it in "
                  f"{settings.landing.dir} (no worker has flushed it with onceflow.landing.dir "
                  "set); --source store reads it", file=sys.stderr)
    spark = spark or build_session(settings.analytics.spark, master)
    with spark_progress(spark, console, "analytics") as step:
        step("reading aggregates")
        frames = read_frames(spark, settings, pipeline, stages, source=source,
                             since_ms=since_ms, until_ms=until_ms)
        out.mkdir(parents=True, exist_ok=True)
        if job is None:
            return overview(spark, frames, out, settings, step)
        step("running the job")
        return job(spark, frames, out, settings)


def summary_table(result: OverviewResult) -> Table:
    table = Table(title="onceflow analytics")
    table.add_column("stage", no_wrap=True)
    for column in ("keys", "windows", "closed", "numeric fields"):
        table.add_column(column, justify="right")
    for stage, v in result.summary["stages"].items():
        table.add_row(stage, f"{v['keys']:,}",
                      f"{v['windows']:,}" if v["windowed"] else "-",
                      f"{v['closed']:,}" if v["windowed"] else "-", v["fields"] or "-")
    return table


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="onceflow analytics", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", required=True, help="application HOCON file")
    parser.add_argument("--job", metavar="MODULE:FUNCTION",
                        help="run this function(spark, frames, out, settings) instead of the "
                        "generic report")
    parser.add_argument("--master", help="Spark master (default onceflow.analytics.spark.master)")
    parser.add_argument("--since", type=parse_time, help="first window start (inclusive)")
    parser.add_argument("--until", type=parse_time, help="last window start (exclusive)")
    parser.add_argument("--out", type=Path,
                        help="output directory (default onceflow.analytics.out)")
    parser.add_argument("--source", choices=("store", "landing"), default="store",
                        help="read the stores (default), or the landing zone: closed windows "
                        "and each key's latest state; aggregates without files there are "
                        "left out and named on stderr")
    parser.add_argument("--follow", action="store_true",
                        help="stream fleet counters from the landing zone until interrupted")
    parser.add_argument("--once", action="store_true",
                        help="with --follow: process the files there now, then stop")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable)")
    args = parser.parse_args(argv)
    from onceflow.runtime.wiring import load_pipeline

    try:
        overrides = dict(split_assignment(a) for a in args.set)
        settings = load_settings(args.config, overrides)
        pipeline = load_pipeline(settings)
        job = load_job(args.job) if args.job else None
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
                               console=console, job=job)
    except ConfigError as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except NoExecutors as error:
        print(f"onceflow: spark: {error}", file=sys.stderr)
        return EXIT_FAILED
    if job is not None:
        console.print(f"job {args.job} done; output in {out}", soft_wrap=True)
        return 0
    console.print(summary_table(result))
    console.print(f"elapsed {result.elapsed:.1f} s; report: {result.report}", soft_wrap=True)
    for name, path in result.charts.items():
        console.print(f"chart {name}: {path}", soft_wrap=True)
    return 0


def _follow(settings: Settings, pipeline: Pipeline, master: str | None, out: Path, once: bool,
            console: Console) -> int:
    from onceflow.analytics.follow import follow_stages

    if settings.landing.dir is None:
        print(f"onceflow: config error: {settings.source}: onceflow.landing.dir: expected a "
              "directory: --follow reads the landing zone", file=sys.stderr)
        return EXIT_CONFIG
    try:
        spark = build_session(settings.analytics.spark, master)
    except NoExecutors as error:
        print(f"onceflow: spark: {error}", file=sys.stderr)
        return EXIT_FAILED

    def show(batch: int, counters: dict[str, dict[str, Any]]) -> None:
        console.print(f"batch {batch}: " + json.dumps(counters, sort_keys=True), soft_wrap=True)

    windowed = windowed_stages(pipeline)
    plain = [spec.id for spec in pipeline.aggregates if spec.window is None]
    query = follow_stages(spark, settings.landing.dir, windowed, plain,
                          out / "follow-checkpoint", show, once=once)
    if not once:
        console.print(f"following {settings.landing.dir} (Ctrl-C to stop)")
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
    return 0
