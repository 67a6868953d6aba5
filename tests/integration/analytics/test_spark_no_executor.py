"""A cluster that cannot grant the asked executor fails the analytics job fast, with the
master's reason, instead of leaving it at "reading aggregates" forever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.devtools.spark_cluster import SparkCluster, start_spark_cluster

APP = '''
from onceflow.stages import Pipeline

pipeline = Pipeline("starved", topics=("starved",), format="json").aggregate(
    "per_key", key=lambda e: e["k"], init=lambda: 0, fold=lambda n, e: n + 1)
'''
WAIT_S = 15


@pytest.fixture
def small_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """One worker of 512 MB: less than the 2g executor the test asks for."""
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "PYSPARK_PYTHON": sys.executable}
    cluster = start_spark_cluster(tmp_path_factory.mktemp("small-cluster"), workers=1,
                                  worker_memory="512m", worker_cores=1, env=env)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_job_no_worker_can_host_fails_within_the_bound_with_the_masters_reason(
        small_cluster: SparkCluster, tmp_path: Path) -> None:
    (tmp_path / "starved_app.py").write_text(APP)
    conf = tmp_path / "app.conf"
    conf.write_text(textwrap.dedent(f'''\
        onceflow.pipeline = "starved_app:pipeline"
        onceflow.analytics.spark {{
          master = "{small_cluster.master_url}", ui-enabled = false, driver-memory = 512m
          executor-memory = 2g, executor-wait = {WAIT_S}s
          conf {{ "spark.master.ui.port" = {small_cluster.ui_port} }}
        }}
        '''))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "onceflow", "analytics", "-c", str(conf),
                             "--out", str(tmp_path / "out")], env=env, capture_output=True,
                            text=True, timeout=240, check=False)
    elapsed = time.monotonic() - started

    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    error = result.stderr
    assert f"no Spark executor registered with {small_cluster.master_url} within {WAIT_S} s" \
        in error, error
    assert "executors of 2g" in error, error
    assert "is WAITING, 2048 MB per executor" in error, error  # the master's view of the app
    assert "512 MB free of 512 MB, 1 of 1 core(s) free" in error, error  # and of its worker
    assert elapsed >= WAIT_S, elapsed  # it did wait for the bound
    # The driver gave up on the application: the master lists it finished, nothing waits.
    status = small_cluster.status()
    assert not status["activeapps"] and len(status["completedapps"]) == 1, status
