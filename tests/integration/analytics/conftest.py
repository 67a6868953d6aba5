"""One SparkSession (local[2], no UI, few shuffle partitions) for every analytics test, and
a standalone Spark cluster for the tests that run on one."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from onceflow.analytics.session import build_session
from onceflow.devtools.spark_cluster import SparkCluster, start_spark_cluster
from onceflow.runtime.config import SparkSettings

TEST_SPARK = SparkSettings(master="local[2]", app_name="onceflow-tests", driver_memory="1g",
                           executor_memory="1g", shuffle_partitions=4, ui_enabled=False, conf=())


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = build_session(TEST_SPARK)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master and two workers (1 core, 512 MB each) from the installed PySpark,
    shared by the tests that run on one (it starts in about 40 s on a loaded machine).

    Executors inherit the workers' environment: ``PYTHONPATH`` makes them import this
    checkout's onceflow, as the driver does. A cluster that does not come up fails the
    test with the reason and the log's tail (``ServiceError``).
    """
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "PYSPARK_PYTHON": sys.executable}
    cluster = start_spark_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2,
                                  worker_memory="512m", worker_cores=1, env=env)
    try:
        yield cluster
    finally:
        cluster.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here is marked ``spark``: ``make test`` runs them in one pytest process
    of their own (one Spark JVM, one job at a time) beside the parallel part."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.spark)
