"""A Spark standalone cluster (a master and workers) from the installed PySpark.

For tests and local runs of ``onceflow analytics --master spark://...``: the
master and each worker are ``pyspark/bin/spark-class`` processes bound to
127.0.0.1 on free ports, small (``worker_memory`` and ``worker_cores`` each, the
daemons themselves at 256 MB of heap), with their logs and work directories
under ``state_dir``. The cluster counts as up once the master's status page
lists every worker ALIVE. Executors run the Python the driver names
(``PYSPARK_PYTHON``, set by ``onceflow.analytics.session``) and inherit the
workers' environment, so ``env`` (e.g. ``PYTHONPATH``) is how they find
onceflow, the store drivers and user modules; on one machine with onceflow
installed in the driver's virtualenv nothing more is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow.devtools.services import (
    HOST,
    ServiceError,
    ServiceInfo,
    _free_ports,
    _NotReady,
    _wait_ready,
    stop,
)

__all__ = ["SparkCluster", "spark_class", "start_spark_cluster"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass(frozen=True)
class SparkCluster:
    """A running cluster: ``master_url`` (``spark://127.0.0.1:PORT``) for ``--master``."""

    master: ServiceInfo
    ui_port: int
    workers: tuple[ServiceInfo, ...]
    state_dir: Path

    @property
    def master_url(self) -> str:
        return f"spark://{self.master.address}"

    def status(self) -> dict[str, Any]:
        """The master's status page (workers, running and completed applications)."""
        with urllib.request.urlopen(f"http://{HOST}:{self.ui_port}/json/", timeout=5) as page:
            answer: dict[str, Any] = json.load(page)
        return answer

    def stop(self) -> None:
        """Stop the workers, then the master (each SIGTERM, SIGKILL after 10 s)."""
        for info in (*self.workers, self.master):
            stop(info, timeout=10)


def spark_class() -> Path:
    """``bin/spark-class`` of the installed PySpark (the analytics extra)."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def start_spark_cluster(state_dir: Path, workers: int = 2, worker_memory: str = "1g",
                        worker_cores: int = 1, env: Mapping[str, str] | None = None,
                        timeout: float = 120) -> SparkCluster:
    """Start a master and ``workers`` workers; raise ``ServiceError`` (with the log's
    tail) if one exits or the master does not list them all within ``timeout`` s.

    ``worker_memory`` is what a worker grants its executors: 1g by default, so an
    executor of the default ``onceflow.analytics.spark.executor-memory`` (1g, Spark's
    own default) fits (a worker's JVMs use only what they need of it)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    master_port, ui_port, *ports = _free_ports(2 + 2 * workers)
    environment = {**os.environ, "SPARK_LOCAL_IP": HOST, "SPARK_DAEMON_MEMORY": "256m",
                   # the REST submission server would take the fixed port 6066
                   "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                   "SPARK_LOG_DIR": str(state_dir), **(env or {})}
    master = _spawn("spark-master", [
        str(spark_class()), MASTER_CLASS, "--host", HOST, "--port", str(master_port),
        "--webui-port", str(ui_port)], state_dir, environment, master_port)
    cluster = SparkCluster(master, ui_port, (), state_dir)
    started: list[ServiceInfo] = []
    try:
        _wait_ready(master, lambda: _alive(cluster, 0), timeout)
        for i in range(workers):
            work = state_dir / f"worker-{i}"
            work.mkdir(exist_ok=True)
            started.append(_spawn(f"spark-worker-{i}", [
                str(spark_class()), WORKER_CLASS, "--host", HOST, "--port", str(ports[2 * i]),
                "--webui-port", str(ports[2 * i + 1]), "--cores", str(worker_cores),
                "--memory", worker_memory, "--work-dir", str(work), cluster.master_url],
                state_dir, environment, ports[2 * i]))
        for info in started:  # each worker must stay up; the master must list them all
            _wait_ready(info, lambda: _alive(cluster, workers), timeout)
    except ServiceError:
        for info in (*started, master):
            stop(info, timeout=10)
        raise
    return SparkCluster(master, ui_port, tuple(started), state_dir)


def _spawn(name: str, cmd: Sequence[str], state_dir: Path, env: Mapping[str, str],
           port: int) -> ServiceInfo:
    """Start ``cmd`` in its own session (``stop`` signals the whole group: the JVM that
    ``spark-class`` execs), output to ``state_dir/<name>.log``."""
    log_path = state_dir / f"{name}.log"
    with log_path.open("ab") as out:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=state_dir, env=dict(env),
                                start_new_session=True)
    return ServiceInfo(name=name, host=HOST, port=port, pid=proc.pid, log=log_path)


def _alive(cluster: SparkCluster, workers: int) -> None:
    """Pass once the master is ALIVE with at least ``workers`` ALIVE workers."""
    try:
        page = cluster.status()
    except OSError as error:
        raise _NotReady(f"status page: {error}") from None
    alive = sum(1 for w in page.get("workers", ()) if w.get("state") == "ALIVE")
    if page.get("status") != "ALIVE" or alive < workers:
        raise _NotReady(f"master {page.get('status')}, {alive} of {workers} workers alive")
