"""A cluster that cannot grant the asked executor fails the analytics job fast, with the
master's reason, instead of leaving it at "reading aggregates" forever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from onceflow.devtools.spark_cluster import SparkCluster

APP = '''
from onceflow.stages import Pipeline

pipeline = Pipeline("starved", topics=("starved",), format="json").aggregate(
    "per_key", key=lambda e: e["k"], init=lambda: 0, fold=lambda n, e: n + 1)
'''
WAIT_S = 15


def test_a_job_no_worker_can_host_fails_within_the_bound_with_the_masters_reason(
        spark_cluster: SparkCluster, tmp_path: Path) -> None:
    """The shared cluster's workers have 512 MB each: less than the 2g executor asked."""
    (tmp_path / "starved_app.py").write_text(APP)
    conf = tmp_path / "app.conf"
    conf.write_text(textwrap.dedent(f'''\
        onceflow.pipeline = "starved_app:pipeline"
        onceflow.analytics.spark {{
          master = "{spark_cluster.master_url}", app-name = starved, ui-enabled = false
          driver-memory = 512m
          executor-memory = 2g, executor-wait = {WAIT_S}s
          conf {{ "spark.master.ui.port" = {spark_cluster.ui_port} }}
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
    assert f"no Spark executor registered with {spark_cluster.master_url} within {WAIT_S} s" \
        in error, error
    assert "executors of 2g" in error, error
    assert "is WAITING, 2048 MB per executor" in error, error  # the master's view of the app
    assert error.count("512 MB free of 512 MB, 1 of 1 core(s) free") == 2, error  # workers
    assert elapsed >= WAIT_S, elapsed  # it did wait for the bound
    # The driver gave up on the application: the master lists it finished, nothing waits.
    status = spark_cluster.status()
    assert not status["activeapps"], status
    assert [a["state"] for a in status["completedapps"] if a["name"] == "starved"] == [
        "FINISHED"], status
