"""`onceflow analytics` on a real Spark standalone cluster (a master and two workers started
from the installed PySpark) over a pipeline's persisted states in Redis and Cassandra: the
executors read both stores, and every result equals local mode and the ground truth."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from onceflow.analytics.cli import cli as analytics_cli
from onceflow.devtools import harness
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.devtools.spark_cluster import SparkCluster

APP = '''
"""Per robot (Redis) and per robot and minute (Cassandra), and a job that reports both."""
import json
import os

from onceflow.examples.robots import count, fastenings, new_counts
from onceflow.stages import Pipeline, Tumbling

pipeline = (
    Pipeline("clustered", topics=(os.environ["CLUSTER_TOPIC"],), format="json")
    .flat_map("fastenings", fastenings)
    .aggregate("per_robot", key=lambda f: f.robot, init=new_counts, fold=count)
    .aggregate("per_minute", key=lambda f: f.robot, init=new_counts, fold=count,
               window=Tumbling(60_000, event_time_ms=lambda f: f.ts), store="cassandra")
)


def job(spark, frames, out, settings):
    """The generic report (what `onceflow analytics` runs without --job), then the totals."""
    from onceflow.analytics.overview import overview

    overview(spark, frames, out, settings)
    totals = {r["key"]: [r["ok"], r["failed"]] for r in frames["per_robot"].collect()}
    minutes = {f'{r["key"]}|{r["window_start"]}': [r["ok"], r["failed"], r["closed"]]
               for r in frames["per_minute"].collect()}
    (out / "job.json").write_text(json.dumps({"master": spark.sparkContext.master,
                                              "totals": totals, "minutes": minutes}))
'''
TABLES = ("stages", "distributions", "top_keys", "over_time")


def analytics(env: dict[str, str], conf: Path, out: Path, *extra: str) -> None:
    result = subprocess.run([sys.executable, "-m", "onceflow", "analytics", "-c", str(conf),
                             "--out", str(out), *extra], env=env, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def tables(out: Path) -> dict[str, list[str]]:
    """The generic report's tables, each row as sorted JSON (read with pyarrow)."""
    return {name: sorted(json.dumps(row, sort_keys=True) for row in
                         pq.read_table(out / "tables" / f"{name}.parquet").to_pylist())
            for name in TABLES}


def test_analytics_on_a_standalone_cluster_equals_local_mode(
        spark: Any, spark_cluster: SparkCluster, kafka_service: ServiceInfo,
        redis_service: ServiceInfo, cassandra_service: ServiceInfo, tmp_path: Path,
        unique_name: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap = kafka_service.address
    topic, prefix, keyspace = unique_name("cluster"), unique_name("p"), unique_name("ks")
    app = tmp_path / "app"
    app.mkdir()
    (app / "clustered_app.py").write_text(APP)
    conf = tmp_path / "app.conf"
    conf.write_text(textwrap.dedent(f'''\
        onceflow.pipeline = "clustered_app:pipeline"
        onceflow.kafka {{ bootstrap-servers = "{bootstrap}", group-id = "{unique_name("g")}",
                         session-timeout = 6s, heartbeat-interval = 2s }}
        onceflow.persistence.interval = 500ms
        onceflow.commit.interval = 1s
        onceflow.windows.idle-timeout = 10s  # the first start closes windows after this
        onceflow.stores.redis {{ url = "redis://{redis_service.address}/0",
                                key-prefix = "{prefix}" }}
        onceflow.stores.cassandra {{ contact-points = ["{cassandra_service.host}"],
            port = {cassandra_service.port}, keyspace = "{keyspace}", protocol-version = 3 }}
        onceflow.analytics {{
          top-n = 5, cassandra-splits = 4, redis-shards = 4
          spark {{ master = "local[2]", ui-enabled = false, driver-memory = "512m",
                  executor-memory = "512m", shuffle-partitions = 4 }}
        }}
        '''))
    env = {**os.environ, "CLUSTER_TOPIC": topic,
           "PYTHONPATH": os.pathsep.join([str(app), os.environ.get("PYTHONPATH", "")])}
    stream = generate(3_000, robots=40, seed=57)  # in order: nothing is late
    asyncio.run(harness.create_topic(bootstrap, topic, 4))
    asyncio.run(harness.produce(bootstrap, topic, stream.messages))
    worker = harness.WorkerProcess([sys.executable, "-m", "onceflow", "run", "-c", str(conf)],
                                   env, tmp_path)
    worker.start()
    try:
        waited = subprocess.run([sys.executable, "-m", "onceflow", "status", "-c", str(conf),
                                 "--wait", "--timeout", "150"], env=env, capture_output=True,
                                text=True, timeout=200, check=False)
        assert waited.returncode == 0, (waited.stderr, worker.logs[-1].read_text()[-3000:])
    finally:
        assert worker.terminate(timeout=30) == 0

    # Local mode in this process (the suite's local[2] session); on the cluster, one
    # application runs the generic report and the job's own reads.
    local, cluster = tmp_path / "local", tmp_path / "cluster"
    monkeypatch.syspath_prepend(str(app))
    monkeypatch.setenv("CLUSTER_TOPIC", topic)
    assert analytics_cli(["-c", str(conf), "--out", str(local)]) == 0
    earlier = {app["id"] for app in spark_cluster.status()["completedapps"]}  # shared cluster
    analytics(env, conf, cluster, "--job", "clustered_app:job",
              "--master", spark_cluster.master_url)
    assert tables(cluster) == tables(local)
    assert tables(local)["stages"] and tables(local)["over_time"]
    assert sorted(p.name for p in (cluster / "charts").glob("*.png")) == sorted(
        p.name for p in (local / "charts").glob("*.png"))

    written = json.loads((cluster / "job.json").read_text())
    assert written["master"] == spark_cluster.master_url
    assert written["totals"] == {robot: [c["ok"], c["failed"]]
                                 for robot, c in stream.truth.items()}
    minutes: dict[str, Counter[str]] = {}
    for _, value in stream.messages:
        report = json.loads(value)
        for r in report["results"]:
            slot = f'{report["serial"]}|{r["ts"] - r["ts"] % 60_000}'
            minutes.setdefault(slot, Counter())["ok" if r["ok"] else "failed"] += 1
    assert {slot: v[:2] for slot, v in written["minutes"].items()} == {
        slot: [c["ok"], c["failed"]] for slot, c in minutes.items()}
    assert {v[2] for v in written["minutes"].values()} == {True, False}  # history and open

    # The work ran in the cluster's executors: one on each worker, the application done.
    status: dict[str, Any] = spark_cluster.status()
    ours = [app["id"] for app in status["completedapps"] if app["id"] not in earlier]
    assert len(ours) == 1 and not status["activeapps"], status
    for i in range(2):
        executors = list((spark_cluster.state_dir / f"worker-{i}" / ours[0]).glob("*/stderr"))
        assert len(executors) == 1, f"worker {i} ran {executors}"
