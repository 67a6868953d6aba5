"""The typed settings: one frozen dataclass per block of reference.conf.

``onceflow.runtime.config`` builds them from HOCON (and re-exports them); the
rest of the runtime reads their plain attributes. Fields have no defaults:
every default lives in reference.conf, which the loader always reads, and
whoever builds one by hand gives every value. The one exception,
``CassandraReplication``, leaves unset the field its strategy does not use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from onceflow.runtime.kafka_security import KafkaSecurity
from onceflow.stores.access import StoreAccess

OffsetReset = Literal["earliest", "latest"]
IsolationLevel = Literal["read_committed", "read_uncommitted"]
ReplicationClass = Literal["SimpleStrategy", "NetworkTopologyStrategy"]


@dataclass(frozen=True)
class ConnectionCheckerSettings:
    """``onceflow.kafka.connection-checker``: Alpakka's names and meaning."""

    enable: bool
    max_retries: int
    check_interval: float
    backoff_factor: float


@dataclass(frozen=True)
class ProducerSettings:
    """``onceflow.kafka.producer``: time-bounded delivery; Kafka's names and meaning."""

    max_block: float
    metadata_max_age: float
    delivery_timeout: float
    request_timeout: float
    retries: int
    retry_backoff: float
    reconnect_backoff: float
    reconnect_backoff_max: float
    max_in_flight: int
    linger: float
    batch_size: int
    outbox_store: str


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
    repartition_replication_factor: int
    connection_checker: ConnectionCheckerSettings
    producer: ProducerSettings
    join_timeout: float
    security: KafkaSecurity
    dead_letter_max_value: int = 524_288  # bytes of value a dead letter keeps
    isolation_level: IsolationLevel = "read_committed"  # onceflow.kafka.consumer


@dataclass(frozen=True)
class ConsumerSettings:
    """``onceflow.consumer``: backpressure, and re-fetching holes in a partition's offsets."""

    max_in_flight_batches: int
    gap_refetches: int
    gap_refetch_backoff: float
    rewind_grace: float


@dataclass(frozen=True)
class StateSettings:
    """``onceflow.state``: the in-memory state cache of each aggregate, how long
    closed windows' history rows are kept, and after how long without a fold a state
    expires (an aggregate's ``expire_after`` wins); seconds, 0: never."""

    max_cached_states: int
    history_retention: float = 0.0
    max_state_bytes: int = 1_048_576  # one aggregate value, encoded (stages.guards)
    expire_after: float = 0.0


@dataclass(frozen=True)
class WindowSettings:
    """``onceflow.windows``: how long a silent root partition holds windows back, and how
    far an event time may be ahead of its record's Kafka timestamp (seconds)."""

    idle_timeout: float = 300.0
    max_future: float = 3600.0


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
    """``onceflow.stores.redis``: the aggregate state store; ``wait_replicas`` replicas
    acknowledge each write within ``wait_timeout`` s (0: no WAIT)."""

    url: str
    key_prefix: str
    access: StoreAccess
    wait_replicas: int = 0
    wait_timeout: float = 1.0


@dataclass(frozen=True)
class CassandraReplication:
    """``onceflow.stores.cassandra.replication``: used only to create the keyspace.

    ``replication_factor`` is set for SimpleStrategy, ``datacenters`` (name,
    copies) for NetworkTopologyStrategy.
    """

    strategy: ReplicationClass
    # Not in reference.conf by design: each strategy leaves the other's field unset.
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
    access: StoreAccess


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

    policy: str
    max_restarts: int
    within: float
    backoff_initial: float
    backoff_max: float
    backoff_jitter: float
    escalation_grace: float
    max_repeats: int = 5  # the same failure this many times in a row escalates (0: never)


@dataclass(frozen=True)
class MetricsSettings:
    """``onceflow.metrics``: the stats log line and the /metrics + /health endpoint."""

    stats_interval: float
    port: int
    host: str
    stall_timeout: float
    lag_interval: float = 5.0  # how often /health's lag is read from Kafka


@dataclass(frozen=True)
class LandingSettings:
    """``onceflow.landing``: the Parquet landing zone of closed windows (None = off)."""

    dir: str | None


@dataclass(frozen=True)
class SparkSettings:
    """``onceflow.analytics.spark``: how the analytics jobs build their SparkSession."""

    master: str
    app_name: str
    driver_memory: str
    executor_memory: str
    shuffle_partitions: int
    ui_enabled: bool
    conf: tuple[tuple[str, str], ...]
    executor_wait: float = 60.0  # s a cluster job waits for its first executor


@dataclass(frozen=True)
class AnalyticsSettings:
    """``onceflow.analytics``: the batch job's parameters and the store readers' splits."""

    spark: SparkSettings
    out: str
    top_n: int
    anomaly_k: float
    min_events: int
    cassandra_splits: int
    redis_shards: int


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs; ``source`` is the application file it came from."""

    pipeline: str
    source: str
    kafka: KafkaSettings
    consumer: ConsumerSettings
    persistence: PersistenceSettings
    state: StateSettings
    commit: CommitSettings
    stores: StoresSettings
    shutdown: ShutdownSettings
    metrics: MetricsSettings
    landing: LandingSettings
    analytics: AnalyticsSettings
    supervision: SupervisionSettings
    single_worker: bool
    pipeline_settings: dict[str, Any]
    windows: WindowSettings = field(default_factory=lambda: WindowSettings())
    #: ``onceflow.cpu``: "auto", "off" or the CPU the worker's threads stay on
    #: (``runtime.cpu_placement``).
    cpu: str | int = "auto"
    #: ``<file>: <key>: <problem>`` of values accepted but most likely not meant (a group
    #: id with a space); the worker logs each at start.
    warnings: tuple[str, ...] = ()

