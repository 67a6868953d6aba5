"""One SparkSession (local[2], no UI, few shuffle partitions) for every analytics test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from onceflow.analytics.session import build_session
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
