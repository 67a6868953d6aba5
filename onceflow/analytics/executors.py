"""Fail fast when a Spark cluster gives the job no executor, with the cluster's reason.

A standalone master that has no worker with ``spark.executor.memory`` (and
the cores) free keeps the application WAITING: the driver hangs without a
word at its first job. So on a cluster master the session waits at most
``onceflow.analytics.spark.executor-wait`` for its first executor (the
status tracker lists the driver and each registered executor), then fails
with what Spark knows: the master's status page (``/json`` of its web UI,
port ``spark.master.ui.port``, default 8080) lists each worker's free memory
and cores beside the application's request. Local masters and dynamic
allocation (which starts executors only for work) are not checked.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any
from urllib.parse import urlsplit

__all__ = ["NoExecutors", "await_executors", "is_cluster", "master_report"]

#: Spark's own words for this state (TaskSchedulerImpl's starvation warning).
SPARK_SAYS = ("Initial job has not accepted any resources; check your cluster UI to ensure "
              "that workers are registered and have sufficient resources")


class NoExecutors(RuntimeError):
    """No executor registered within the bound; the message says why, as Spark knows it."""


def is_cluster(master: str) -> bool:
    """Whether executors are separate processes a cluster manager must grant."""
    return not master.startswith("local")


def await_executors(spark: Any, master: str, timeout_s: float, poll_s: float = 0.25) -> None:
    """Return once an executor has registered; raise ``NoExecutors`` after ``timeout_s``."""
    context = spark.sparkContext
    if not is_cluster(master) or context.getConf().get(
            "spark.dynamicAllocation.enabled", "false").lower() == "true":
        return
    tracker = context.statusTracker()
    deadline = time.monotonic() + timeout_s
    while len(tracker.getExecutorInfos()) < 2:  # the driver is always listed
        if time.monotonic() >= deadline:
            raise NoExecutors(_reason(context, master, timeout_s))
        time.sleep(poll_s)


def _reason(context: Any, master: str, timeout_s: float) -> str:
    conf = context.getConf()
    memory = conf.get("spark.executor.memory", "1g")
    cores = conf.get("spark.executor.cores", None)
    asked = (f"executors of {memory} and {cores} core(s)" if cores
             else f"executors of {memory} (and a worker's free cores)")
    head = (f"no Spark executor registered with {master} within {timeout_s:g} s "
            f"(onceflow.analytics.spark.executor-wait); the application asks for {asked} "
            f"(onceflow.analytics.spark.executor-memory, spark.executor.cores)")
    if not master.startswith("spark://"):
        return f"{head}. Spark: {SPARK_SAYS}."
    port = int(conf.get("spark.master.ui.port", "8080"))
    return f"{head}. {master_report(master, port, context.applicationId)}."


def master_report(master: str, ui_port: int, app_id: str | None = None) -> str:
    """What a standalone master's status page says about its workers and ``app_id``."""
    reports = []
    for address in master.removeprefix("spark://").split(","):
        host = urlsplit(f"//{address}").hostname or address
        url = f"http://{host}:{ui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=5) as page:
                status: dict[str, Any] = json.load(page)
        except (OSError, ValueError) as error:
            reports.append(f"The master's status page {url} did not answer ({error}); "
                           f"Spark: {SPARK_SAYS}")
            continue
        if status.get("status") not in (None, "ALIVE"):
            reports.append(f"The master {address} is {status.get('status')}")
            continue
        workers = [w for w in status.get("workers", ()) if w.get("state") == "ALIVE"]
        shown = "; ".join(
            f"{w.get('host')}:{w.get('port')} {w.get('memoryfree')} MB free of "
            f"{w.get('memory')} MB, {w.get('coresfree')} of {w.get('cores')} core(s) free"
            for w in workers) or "none"
        app = next((a for a in (*status.get("activeapps", ()), *status.get("completedapps", ()))
                    if a.get("id") == app_id), None)
        state = (f"application {app_id} is {app.get('state')}, "
                 f"{app.get('memoryperexecutor', app.get('memoryperslave'))} MB per executor"
                 if app else f"application {app_id} not listed")
        reports.append(f"The master ({url}) says: {state}; ALIVE workers: {shown}")
    return ". ".join(reports)
