"""Spark analytics over the persisted aggregates.

- :mod:`~onceflow.analytics.landing`: the idempotent Parquet landing zone the
  persistence actor writes closed windows to (pyarrow; no Spark needed).
- :mod:`~onceflow.analytics.readers`: Spark readers running in the executors
  (Cassandra by token range, Redis by SCAN pattern shard, the landing zone).
- :mod:`~onceflow.analytics.job` and :mod:`~onceflow.analytics.report`: the batch
  job (rates, top failing, hourly trend, anomalies), its charts and HTML page.
- :mod:`~onceflow.analytics.follow`: Structured Streaming fleet counters.
- :mod:`~onceflow.analytics.cli`: ``onceflow analytics``.

Importing this package loads neither pyspark nor pyarrow.
"""
