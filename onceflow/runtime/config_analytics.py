"""Builds ``onceflow.analytics``: the Spark session and the batch job's parameters."""

from __future__ import annotations

from pyhocon import ConfigTree

from onceflow.runtime.config_reader import Reader, show
from onceflow.runtime.settings import AnalyticsSettings, SparkSettings

_MASTER = r"local(\[(\*|\d+)(,\d+)?\])?|(spark|yarn|k8s|mesos)://\S+|yarn"
_MASTER_HINT = "local, local[N], local[*] or a cluster URL such as spark://host:7077"


def analytics_settings(read: Reader) -> AnalyticsSettings:
    """``onceflow.analytics``; Spark's own settings pass through as strings."""
    a = "onceflow.analytics."
    s = a + "spark."
    conf = read.raw(s + "conf")
    extra: list[tuple[str, str]] = []
    if conf is not None:
        if not isinstance(conf, ConfigTree):
            raise read.error(s + "conf", f"expected an object of Spark settings, got {show(conf)}")
        for name, value in conf.as_plain_ordered_dict().items():
            if not name.startswith("spark.") or isinstance(value, dict | list) or value is None:
                raise read.error(f'{s}conf."{name}"', "expected a spark.* key with a "
                                 f"string, number or boolean value, got {show(value)}")
            extra.append((name, str(value).lower() if isinstance(value, bool) else str(value)))
    ui = read.raw(s + "ui-enabled")
    if not isinstance(ui, bool):
        raise read.error(s + "ui-enabled", f"expected true or false, got {show(ui)}")
    k = read.raw(a + "anomaly-k")
    if isinstance(k, bool) or not isinstance(k, int | float) or not 0 < k <= 100:
        raise read.error(a + "anomaly-k", f"expected a number in (0, 100], got {show(k)}")
    return AnalyticsSettings(
        spark=SparkSettings(
            master=read.text(s + "master", _MASTER, _MASTER_HINT),
            app_name=read.text(s + "app-name"),
            driver_memory=read.memory(s + "driver-memory"),
            executor_memory=read.memory(s + "executor-memory"),
            shuffle_partitions=read.integer(s + "shuffle-partitions", 1, 100_000),
            ui_enabled=ui,
            conf=tuple(extra),
            executor_wait=read.duration(s + "executor-wait", 1, 86_400),
        ),
        out=read.text(a + "out"),
        top_n=read.integer(a + "top-n", 1, 10_000),
        anomaly_k=float(k),
        min_events=read.integer(a + "min-events", 1, 1_000_000),
        cassandra_splits=read.integer(a + "cassandra-splits", 1, 100_000),
        redis_shards=read.integer(a + "redis-shards", 1, 256),
    )
