"""The typed settings: one frozen dataclass per block of reference.conf.

``onceflow.runtime.config`` builds them from HOCON (and re-exports them); the
rest of the runtime reads their plain attributes. The field defaults serve
tests and programmatic use; the defaults a worker runs with come from
reference.conf, and tests/unit/test_config.py checks that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

OffsetReset = Literal["earliest", "latest"]
ReplicationClass = Literal["SimpleStrategy", "NetworkTopologyStrategy"]


@dataclass(frozen=True)
class ConnectionCheckerSettings:
    """``onceflow.kafka.connection-checker``: Alpakka's names and meaning."""

    enable: bool = True
    max_retries: int = 3
    check_interval: float = 15.0
    backoff_factor: float = 2.0


@dataclass(frozen=True)
class ProducerSettings:
    """``onceflow.kafka.producer``: time-bounded delivery; Kafka's names and meaning."""

    max_block: float = 60.0
    delivery_timeout: float = 120.0
    request_timeout: float = 30.0
    retries: int = 2_147_483_647
    retry_backoff: float = 0.1
    reconnect_backoff: float = 0.05
    reconnect_backoff_max: float = 1.0
    max_in_flight: int = 1
    linger: float = 0.005
    batch_size: int = 1_048_576
    outbox_store: str = "auto"


@dataclass(frozen=True)
class KafkaSettings:
    """``onceflow.kafka``: the Kafka client; durations in seconds."""

    bootstrap_servers: str
    group_id: str
    client_id: str
    auto_offset_reset: OffsetReset
    session_timeout: float
    heartbeat_interval: float
    request_timeout: float
    max_poll_records: int
    fetch_max_wait: float
    dead_letter_topic: str
    late_events_topic: str
    repartition_replication_factor: int = 1
    connection_checker: ConnectionCheckerSettings = field(
        default_factory=lambda: ConnectionCheckerSettings())
    producer: ProducerSettings = field(default_factory=lambda: ProducerSettings())
    join_timeout: float = 120.0


@dataclass(frozen=True)
class ConsumerSettings:
    """``onceflow.consumer``: backpressure, and re-fetching holes in a partition's offsets."""

    max_in_flight_batches: int
    gap_refetches: int = 5
    gap_refetch_backoff: float = 0.1


@dataclass(frozen=True)
class PersistenceSettings:
    """``onceflow.persistence``: how often dirty state is written."""

    interval: float


@dataclass(frozen=True)
class CommitSettings:
    """``onceflow.commit``: how often durable offsets are committed."""

    interval: float


@dataclass(frozen=True)
class RedisSettings:
    """``onceflow.stores.redis``: the aggregate state store."""

    url: str
    key_prefix: str


@dataclass(frozen=True)
class CassandraReplication:
    """``onceflow.stores.cassandra.replication``: used only to create the keyspace.

    ``replication_factor`` is set for SimpleStrategy, ``datacenters`` (name,
    copies) for NetworkTopologyStrategy.
    """

    strategy: ReplicationClass
    replication_factor: int | None = None
    datacenters: tuple[tuple[str, int], ...] = ()

    def cql_options(self) -> dict[str, str | int]:
        """The CQL replication map: ``{"class": "SimpleStrategy", "replication_factor": 1}``."""
        if self.strategy == "SimpleStrategy":
            return {"class": self.strategy, "replication_factor": self.replication_factor or 1}
        return {"class": self.strategy, **dict(self.datacenters)}


@dataclass(frozen=True)
class CassandraSettings:
    """``onceflow.stores.cassandra``: the Cassandra state store; durations in seconds."""

    contact_points: tuple[str, ...]
    port: int
    keyspace: str
    replication: CassandraReplication
    protocol_version: int
    local_datacenter: str | None
    consistency: str
    connect_timeout: float
    request_timeout: float
    concurrency: int


@dataclass(frozen=True)
class StoresSettings:
    """``onceflow.stores``."""

    redis: RedisSettings
    cassandra: CassandraSettings


@dataclass(frozen=True)
class ShutdownSettings:
    """``onceflow.shutdown``: the SIGTERM drain budget."""

    timeout: float


@dataclass(frozen=True)
class SupervisionSettings:
    """``onceflow.supervision``: restart policy, budget and backoff of the actors."""

    policy: str = "rest_for_one"
    max_restarts: int = 5
    within: float = 60.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    backoff_jitter: float = 1.0
    escalation_grace: float = 0.0


@dataclass(frozen=True)
class MetricsSettings:
    """``onceflow.metrics``: the stats log line and the /metrics + /health endpoint."""

    stats_interval: float
    port: int = 0
    host: str = "127.0.0.1"
    stall_timeout: float = 60.0


@dataclass(frozen=True)
class LandingSettings:
    """``onceflow.landing``: the Parquet landing zone of closed windows (None = off)."""

    dir: str | None = None


@dataclass(frozen=True)
class SparkSettings:
    """``onceflow.analytics.spark``: how the analytics jobs build their SparkSession."""

    master: str = "local[*]"
    app_name: str = "onceflow-analytics"
    driver_memory: str = "1g"
    executor_memory: str = "1g"
    shuffle_partitions: int = 8
    ui_enabled: bool = True
    conf: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class AnalyticsSettings:
    """``onceflow.analytics``: the batch job's parameters and the store readers' splits."""

    spark: SparkSettings = SparkSettings()
    out: str = "onceflow-analytics"
    top_n: int = 10
    anomaly_k: float = 2.0
    min_events: int = 3
    cassandra_splits: int = 8
    redis_shards: int = 8


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs; ``source`` is the application file it came from."""

    pipeline: str
    source: str
    kafka: KafkaSettings
    consumer: ConsumerSettings
    persistence: PersistenceSettings
    commit: CommitSettings
    stores: StoresSettings
    shutdown: ShutdownSettings
    metrics: MetricsSettings
    landing: LandingSettings = LandingSettings()
    analytics: AnalyticsSettings = AnalyticsSettings()
    supervision: SupervisionSettings = SupervisionSettings()
    single_worker: bool = False
    pipeline_settings: dict[str, Any] = field(default_factory=dict)

