"""Spark analytics over the persisted aggregates.

- :mod:`~onceflow.analytics.landing`: the idempotent Parquet landing zone the
  persistence actor writes closed windows to (pyarrow; no Spark needed).
- :mod:`~onceflow.analytics.readers`: Spark readers running in the executors
  (Cassandra by token range, Redis by SCAN pattern shard, the landing zone).
- :mod:`~onceflow.analytics.frames`: any aggregate as a DataFrame
  (``states(spark, settings, stage)``), typed when its values are flat.
- :mod:`~onceflow.analytics.overview` and :mod:`~onceflow.analytics.overview_report`:
  the generic report (keys, distributions, top keys, windows over time).
- :mod:`~onceflow.analytics.user_job`: ``--job module:function``; the robots
  report (``onceflow.examples.robots_report``) is one such job.
- :mod:`~onceflow.analytics.follow`: Structured Streaming fleet counters.
- :mod:`~onceflow.analytics.cli`: ``onceflow analytics``.

Importing this package loads neither pyspark nor pyarrow.
"""

from __future__ import annotations

from typing import Any

__all__ = ["states"]


def states(spark: Any, settings: Any, stage: str, **options: Any) -> Any:
    """One aggregate stage as a DataFrame: :func:`onceflow.analytics.frames.states`."""
    from onceflow.analytics import frames

    return frames.states(spark, settings, stage, **options)
