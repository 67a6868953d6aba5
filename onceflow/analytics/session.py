"""The SparkSession from ``onceflow.analytics.spark`` settings, and progress while it works."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from onceflow.analytics.executors import NoExecutors, await_executors
from onceflow.runtime.config import SparkSettings

__all__ = ["build_session", "spark_conf", "spark_progress"]


def spark_conf(settings: SparkSettings, master: str | None = None) -> dict[str, str]:
    """Every Spark setting the session gets (``master`` overrides the configured one)."""
    conf = {
        "spark.master": master or settings.master,
        "spark.app.name": settings.app_name,
        "spark.driver.memory": settings.driver_memory,
        "spark.executor.memory": settings.executor_memory,
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.ui.enabled": "true" if settings.ui_enabled else "false",
        "spark.ui.showConsoleProgress": "false",  # ours is below
        "spark.sql.session.timeZone": "UTC",
    }
    conf.update(dict(settings.conf))
    return conf


def build_session(settings: SparkSettings, master: str | None = None) -> Any:
    """Get or create the SparkSession; executors run this interpreter's Python. On a
    cluster, raise ``NoExecutors`` if none registers within ``settings.executor_wait``."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in spark_conf(settings, master).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")  # Spark warns a lot about normal things
    try:
        await_executors(spark, master or settings.master, settings.executor_wait)
    except NoExecutors:
        spark.stop()  # the master forgets the waiting application
        raise
    return spark


@contextmanager
def spark_progress(spark: Any, console: Console, what: str
                   ) -> Iterator[Callable[[str], None]]:
    """Show the current step and its running Spark tasks until the block ends.

    Yields ``step(name)``: names the Spark jobs that follow (in the bar and
    as their Spark job description). Polls the status tracker (the driver's
    view of jobs), so it works the same in ``local[*]`` and on a cluster.
    """
    current = [what]

    def step(name: str) -> None:
        current[0] = name
        spark.sparkContext.setJobDescription(name)
        progress.update(bar, description=f"{what}: {name}", completed=0, total=None)
        console.print(f"  {name}")

    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    bar = progress.add_task(what, total=None)

    def poll() -> None:
        while not stop.wait(0.3):
            try:
                infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            except Exception:  # the context is stopping
                return
            infos = [i for i in infos if i is not None]
            if infos:
                done = sum(i.numCompletedTasks for i in infos)
                total = sum(i.numTasks for i in infos)
                progress.update(bar, completed=done, total=total,
                                description=f"{what}: {current[0]} (tasks)")

    with progress:
        watcher = threading.Thread(target=poll, name="spark-progress", daemon=True)
        watcher.start()
        try:
            yield step
        finally:
            stop.set()
            watcher.join()
    console.print(f"[green]done[/] {what}")
