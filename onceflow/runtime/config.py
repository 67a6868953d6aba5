"""Settings: HOCON parsed once, at the edge, into one frozen typed object.

The application file is merged over the packaged ``reference.conf`` (every
default lives there) before substitutions resolve, so it may refer to defaults
and ``${?VAR}`` environment overrides work in either file. That merge is done
here rather than by pyhocon, whose merges lose the value an unset ``${?VAR}``
falls back to. Every key is checked against the reference tree and every value
for type and range, so the rest of the runtime reads plain attributes and never
imports pyhocon. Each problem is a :class:`ConfigError`: one ``file: key:
problem`` line.

Example:
    >>> settings = load_settings("config/example.conf")  # doctest: +SKIP
    >>> settings.kafka.session_timeout  # doctest: +SKIP
    30.0
"""

from __future__ import annotations

import difflib
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Literal, cast

from pyhocon import ConfigFactory, ConfigParser, ConfigTree
from pyhocon.config_tree import ConfigValues
from pyhocon.exceptions import ConfigException
from pyparsing import ParseBaseException  # what pyhocon raises on bad syntax

__all__ = [
    "AnalyticsSettings",
    "CassandraReplication",
    "CassandraSettings",
    "CommitSettings",
    "ConfigError",
    "ConsumerSettings",
    "KafkaSettings",
    "LandingSettings",
    "MetricsSettings",
    "PersistenceSettings",
    "RedisSettings",
    "Settings",
    "ShutdownSettings",
    "SparkSettings",
    "StoresSettings",
    "load_settings",
    "parse_duration",
]

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

    policy: str = "one_for_all"
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


class ConfigError(Exception):
    """A bad configuration: ``str(err)`` is ``<file>: <key>: <what was expected>``.

    ``key`` is the full dotted path, or None when the file as a whole is wrong
    (missing, or not HOCON); ``file`` is where the bad value came from.
    """

    def __init__(self, file: str, key: str | None, expected: str) -> None:
        self.file = file
        self.key = key
        self.expected = expected
        super().__init__(f"{file}: {key}: {expected}" if key else f"{file}: {expected}")


OVERRIDES = "<overrides>"
# Mirrors the ${?VAR} lines of reference.conf, so a bad value is blamed on its variable.
_ENV_VARS = {
    "onceflow.pipeline": "ONCEFLOW_PIPELINE",
    "onceflow.kafka.bootstrap-servers": "ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS",
    "onceflow.kafka.group-id": "ONCEFLOW_KAFKA_GROUP_ID",
    "onceflow.stores.redis.url": "ONCEFLOW_REDIS_URL",
    "onceflow.stores.cassandra.contact-points": "ONCEFLOW_CASSANDRA_CONTACT_POINTS",
}
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h|d)\s*")
_PIPELINE = r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*"
_PIPELINE_HINT = "'module:attribute' naming a onceflow.stages.Pipeline"
_REDIS_HINT = "a redis://, rediss:// or unix:// URL"
_SERVERS = r"[^,\s]+:\d+(,\s*[^,\s]+:\d+)*"
_HOST = r"[^,\s]+"
_HOSTS_HINT = "a non-empty list of hosts, or one comma-separated string of them"
_KEYSPACE = r"[a-z][a-z0-9_]{0,47}"
_KEYSPACE_HINT = "a keyspace name: a lowercase letter, then up to 47 of [a-z0-9_]"
_DATACENTER = r"[\w.-]{1,100}"
# Same levels as onceflow.stores.cassandra_store.CONSISTENCY_LEVELS (not imported:
# loading settings must not load the Cassandra driver). Replicas each one waits for,
# where that is a fixed number; the others overlap reads with writes by definition.
_CONSISTENCY = ("ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_ONE", "LOCAL_QUORUM")
_FIXED_REPLICAS = {"ONE": 1, "TWO": 2, "THREE": 3, "LOCAL_ONE": 1}


def parse_duration(value: object) -> float:
    """Return a duration (``"500ms"``, ``"10s"``, ``"2m"``, ``"1h"``, a timedelta) in seconds.

    pyhocon turns unquoted ``10s`` (or ``10 seconds``) into a timedelta but
    leaves ``1.5s`` and quoted values as strings, so both are accepted; strings
    take the short units ns, us, ms, s, m, h, d. A bare number is refused: HOCON
    reads it as milliseconds, most people as seconds.

    Raises:
        ValueError: ``value`` is not a non-negative amount with a unit.
    """
    if isinstance(value, timedelta):
        return value.total_seconds()
    relative = _relativedelta_seconds(value)
    if relative is not None:
        return relative
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"not a duration: {value!r}")
    return float(match[1]) * _UNITS[match[2]]


def _relativedelta_seconds(value: object) -> float | None:
    """Seconds of a ``dateutil.relativedelta`` without months or years, else None.

    pyhocon builds durations as relativedelta instead of timedelta whenever
    python-dateutil is importable (matplotlib brings it in).
    """
    if type(value).__name__ != "relativedelta" or any(
        getattr(value, name, 1) for name in ("months", "years")
    ):
        return None
    parts = ("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0), ("seconds", 1.0), \
        ("microseconds", 1e-6)
    total = sum(float(getattr(value, name, 0)) * size for name, size in parts)
    return total if total >= 0 else None


def load_settings(path: str | Path, overrides: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` over the packaged reference.conf, check it, return Settings.

    Args:
        path: the application HOCON file.
        overrides: dotted key -> HOCON value, applied last
            (``{"onceflow.kafka.bootstrap-servers": "127.0.0.1:1234"}``).

    Raises:
        ConfigError: naming the file, key and expectation of the first problem.
    """
    path = Path(path)
    label = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(label, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(label, None, f"cannot read: {exc}") from None
    reference = resources.files("onceflow.runtime").joinpath("reference.conf").read_text("utf-8")
    schema = ConfigFactory.parse_string(reference, resolve=False)  # resolving drops null keys
    defaults = _resolve(ConfigFactory.parse_string(reference, resolve=False))
    try:
        app = ConfigFactory.parse_string(text, basedir=str(path.parent), resolve=False)
        tree = _resolve(_merge(defaults, app))
    except _HOCON_ERRORS as exc:
        raise _hocon_error(label, exc) from None
    for key, raw in (overrides or {}).items():
        _apply_override(tree, key, raw)

    def origin(key: str) -> str:
        if any(f"{key}.".startswith(f"{k}.") or k.startswith(f"{key}.") for k in overrides or {}):
            return OVERRIDES
        env = _ENV_VARS.get(key)
        if not _declares(app, key) and env and env in os.environ:
            return f"${env}"
        return label

    _check_keys(tree.get("onceflow", None), schema["onceflow"], "onceflow", origin)
    return _build(_Reader(tree, origin), label)


def _build(read: _Reader, source: str) -> Settings:
    if read.raw("onceflow.pipeline") is None:
        raise read.error("onceflow.pipeline", f"missing: set it to {_PIPELINE_HINT}")
    pipeline = read.text("onceflow.pipeline", _PIPELINE, _PIPELINE_HINT)
    k = "onceflow.kafka."
    kafka = KafkaSettings(
        bootstrap_servers=read.text(k + "bootstrap-servers", _SERVERS, "'host:port[,host:port]'"),
        group_id=read.text(k + "group-id"),
        client_id=read.text(k + "client-id"),
        auto_offset_reset=cast(
            OffsetReset,
            read.text(k + "auto-offset-reset", "earliest|latest", "one of 'earliest', 'latest'"),
        ),
        session_timeout=read.duration(k + "session-timeout", 1, 300),
        heartbeat_interval=read.duration(k + "heartbeat-interval", 0.01, 300),
        request_timeout=read.duration(k + "request-timeout", 1, 600),
        max_poll_records=read.integer(k + "max-poll-records", 1, 100_000),
        fetch_max_wait=read.duration(k + "fetch-max-wait", 0, 60),
        dead_letter_topic=read.text(k + "dead-letter-topic", r"[\w.-]{1,249}", "a topic name"),
        late_events_topic=read.text(k + "late-events-topic", r"[\w.-]{1,249}", "a topic name"),
        repartition_replication_factor=read.integer(k + "repartition-replication-factor", 1,
                                                    32767),
        connection_checker=ConnectionCheckerSettings(
            enable=read.boolean(k + "connection-checker.enable"),
            max_retries=read.integer(k + "connection-checker.max-retries", 0, 1000),
            check_interval=read.duration(k + "connection-checker.check-interval", 0.1, 3600),
            backoff_factor=read.number(k + "connection-checker.backoff-factor", 1.0, 100.0),
        ),
        producer=_producer(read),
        join_timeout=read.duration(k + "join-timeout", 1, 3600),
    )
    if kafka.heartbeat_interval >= kafka.session_timeout:
        raise read.error(
            k + "heartbeat-interval",
            f"expected a duration below session-timeout ({_fmt(kafka.session_timeout)}), "
            f"got {_fmt(kafka.heartbeat_interval)}",
        )
    if kafka.join_timeout < kafka.session_timeout:
        raise read.error(
            k + "join-timeout",
            f"expected a duration at least session-timeout ({_fmt(kafka.session_timeout)}), "
            f"got {_fmt(kafka.join_timeout)}",
        )
    redis_url = read.text("onceflow.stores.redis.url", r"(rediss?|unix)://\S+", _REDIS_HINT)
    return Settings(
        pipeline=pipeline,
        source=source,
        kafka=kafka,
        consumer=ConsumerSettings(
            read.integer("onceflow.consumer.max-in-flight-batches", 1, 1000),
            gap_refetches=read.integer("onceflow.consumer.gap-refetches", 0, 100),
            gap_refetch_backoff=read.duration("onceflow.consumer.gap-refetch-backoff", 0, 10),
        ),
        persistence=PersistenceSettings(read.duration("onceflow.persistence.interval", 0.01, 3600)),
        commit=CommitSettings(read.duration("onceflow.commit.interval", 0.01, 3600)),
        stores=StoresSettings(
            RedisSettings(redis_url, read.text("onceflow.stores.redis.key-prefix")),
            _cassandra(read),
        ),
        shutdown=ShutdownSettings(read.duration("onceflow.shutdown.timeout", 0.1, 3600)),
        metrics=MetricsSettings(
            read.duration("onceflow.metrics.stats-interval", 0.1, 3600),
            read.integer("onceflow.metrics.port", 0, 65535),
            read.text("onceflow.metrics.host"),
            read.duration("onceflow.metrics.stall-timeout", 1, 86400),
        ),
        landing=LandingSettings(None if read.raw("onceflow.landing.dir") is None
                                else read.text("onceflow.landing.dir")),
        analytics=_analytics(read),
        supervision=_supervision(read),
        single_worker=read.boolean("onceflow.single-worker"),
        pipeline_settings=_pipeline_settings(read),
    )


def _pipeline_settings(read: _Reader) -> dict[str, Any]:
    key = "onceflow.pipeline-settings"
    raw = read.raw(key)
    if raw is None:
        return {}
    if not isinstance(raw, ConfigTree):
        raise read.error(key, f"expected an object of factory arguments, got {_show(raw)}")
    settings: dict[str, Any] = raw.as_plain_ordered_dict()
    for name in settings:
        if not re.fullmatch(r"[A-Za-z_][\w-]*", name):
            raise read.error(f"{key}.{name}", "expected a name that can be a Python keyword "
                             "argument (letters, digits, _ and -)")
    return dict(settings)


def _producer(read: _Reader) -> ProducerSettings:
    p = "onceflow.kafka.producer."
    settings = ProducerSettings(
        max_block=read.duration(p + "max-block", 0.1, 3600),
        delivery_timeout=read.duration(p + "delivery-timeout", 0.1, 7 * 86400),
        request_timeout=read.duration(p + "request-timeout", 0.1, 3600),
        retries=read.integer(p + "retries", 0, 2_147_483_647),
        retry_backoff=read.duration(p + "retry-backoff", 0.0, 3600),
        reconnect_backoff=read.duration(p + "reconnect-backoff", 0.001, 3600),
        reconnect_backoff_max=read.duration(p + "reconnect-backoff-max", 0.001, 3600),
        max_in_flight=read.integer(p + "max-in-flight", 1, 1_000_000),
        linger=read.duration(p + "linger", 0.0, 60),
        batch_size=read.integer(p + "batch-size", 1024, 64 * 1_048_576),
        outbox_store=read.text(p + "outbox-store", r"auto|redis|cassandra|none",
                               "one of auto, redis, cassandra, none"),
    )
    if settings.max_in_flight != 1:
        raise read.error(p + "max-in-flight", "expected 1 (without idempotent producers, "
                         "which Tansu lacks, a second batch in flight can overtake a failed "
                         f"one, and downstream dedup would drop the re-sent records), got "
                         f"{settings.max_in_flight}")
    if settings.reconnect_backoff_max < settings.reconnect_backoff:
        raise read.error(p + "reconnect-backoff-max", "expected a duration at least "
                         f"reconnect-backoff ({_fmt(settings.reconnect_backoff)}), got "
                         f"{_fmt(settings.reconnect_backoff_max)}")
    return settings


def _supervision(read: _Reader) -> SupervisionSettings:
    k = "onceflow.supervision."
    return SupervisionSettings(
        policy=read.text(k + "policy", r"one_for_one|one_for_all|rest_for_one",
                         "one of one_for_one, one_for_all, rest_for_one"),
        max_restarts=read.integer(k + "max-restarts", 0, 1000),
        within=read.duration(k + "within", 0.1, 86400),
        backoff_initial=read.duration(k + "backoff.initial", 0.0, 3600),
        backoff_max=read.duration(k + "backoff.max", 0.0, 3600),
        backoff_jitter=read.duration(k + "backoff.jitter", 0.0, 3600),
        escalation_grace=read.duration(k + "escalation-grace", 0.0, 3600),
    )


_MEMORY = r"\d+[kmgt]"
_MEMORY_HINT = "a JVM memory size such as 512m or 2g"
_MASTER = r"local(\[(\*|\d+)(,\d+)?\])?|(spark|yarn|k8s|mesos)://\S+|yarn"
_MASTER_HINT = "local, local[N], local[*] or a cluster URL such as spark://host:7077"


def _analytics(read: _Reader) -> AnalyticsSettings:
    a = "onceflow.analytics."
    s = a + "spark."
    conf = read.raw(s + "conf")
    extra: list[tuple[str, str]] = []
    if conf is not None:
        if not isinstance(conf, ConfigTree):
            raise read.error(s + "conf", f"expected an object of Spark settings, got {_show(conf)}")
        for name, value in conf.as_plain_ordered_dict().items():
            if not name.startswith("spark.") or isinstance(value, dict | list) or value is None:
                raise read.error(f'{s}conf."{name}"', "expected a spark.* key with a "
                                 f"string, number or boolean value, got {_show(value)}")
            extra.append((name, str(value).lower() if isinstance(value, bool) else str(value)))
    ui = read.raw(s + "ui-enabled")
    if not isinstance(ui, bool):
        raise read.error(s + "ui-enabled", f"expected true or false, got {_show(ui)}")
    k = read.raw(a + "anomaly-k")
    if isinstance(k, bool) or not isinstance(k, int | float) or not 0 < k <= 100:
        raise read.error(a + "anomaly-k", f"expected a number in (0, 100], got {_show(k)}")
    return AnalyticsSettings(
        spark=SparkSettings(
            master=read.text(s + "master", _MASTER, _MASTER_HINT),
            app_name=read.text(s + "app-name"),
            driver_memory=read.text(s + "driver-memory", _MEMORY, _MEMORY_HINT),
            executor_memory=read.text(s + "executor-memory", _MEMORY, _MEMORY_HINT),
            shuffle_partitions=read.integer(s + "shuffle-partitions", 1, 100_000),
            ui_enabled=ui,
            conf=tuple(extra),
        ),
        out=read.text(a + "out"),
        top_n=read.integer(a + "top-n", 1, 10_000),
        anomaly_k=float(k),
        min_events=read.integer(a + "min-events", 1, 1_000_000),
        cassandra_splits=read.integer(a + "cassandra-splits", 1, 100_000),
        redis_shards=read.integer(a + "redis-shards", 1, 256),
    )


def _cassandra(read: _Reader) -> CassandraSettings:
    c = "onceflow.stores.cassandra."
    version = read.integer(c + "protocol-version", 0, 5)
    if version in (1, 2):
        raise read.error(
            c + "protocol-version",
            f"expected 0 (let the driver negotiate) or 3..5, got {version}",
        )
    local_dc = read.raw(c + "local-datacenter")
    settings = CassandraSettings(
        contact_points=_hosts(read, c + "contact-points"),
        port=read.integer(c + "port", 1, 65535),
        keyspace=read.text(c + "keyspace", _KEYSPACE, _KEYSPACE_HINT),
        replication=_replication(read, c + "replication."),
        protocol_version=version,
        local_datacenter=None if local_dc is None else read.text(
            c + "local-datacenter", _DATACENTER, "null or a datacenter name"
        ),
        consistency=read.text(
            c + "consistency", "|".join(_CONSISTENCY),
            "one of " + ", ".join(repr(level) for level in _CONSISTENCY),
        ),
        connect_timeout=read.duration(c + "connect-timeout", 0.1, 300),
        request_timeout=read.duration(c + "request-timeout", 0.1, 600),
        concurrency=read.integer(c + "concurrency", 1, 1024),
    )
    _check_datacenter(read, settings)
    _check_overlap(read, settings)
    return settings


def _hosts(read: _Reader, key: str) -> tuple[str, ...]:
    value = read.raw(key)
    hosts = [h.strip() for h in value.split(",")] if isinstance(value, str) else value
    if not (isinstance(hosts, list) and hosts and all(
        isinstance(h, str) and re.fullmatch(_HOST, h) for h in hosts
    )):
        raise read.error(key, f"expected {_HOSTS_HINT}, got {_show(value) if value else '[]'}")
    return tuple(hosts)


def _replication(read: _Reader, r: str) -> CassandraReplication:
    strategy = cast(ReplicationClass, read.text(
        r + "class", "SimpleStrategy|NetworkTopologyStrategy",
        "one of 'SimpleStrategy', 'NetworkTopologyStrategy'",
    ))
    datacenters = read.raw(r + "datacenters")
    if strategy == "SimpleStrategy":
        if datacenters is not None:
            raise read.error(r + "datacenters", "expected null with SimpleStrategy "
                             "(set class = NetworkTopologyStrategy to list datacenters)")
        return CassandraReplication(strategy, read.integer(r + "replication-factor", 1, 100))
    if not isinstance(datacenters, ConfigTree) or not datacenters:
        raise read.error(r + "datacenters", "expected copies per datacenter with "
                         f"NetworkTopologyStrategy, e.g. {{dc1 = 3}}, got {_show(datacenters)}")
    factors = []
    for quoted, copies in datacenters.items():
        name = quoted.strip('"')  # pyhocon keeps the quotes of a key holding a dot
        key = f"{r}datacenters.{quoted}"
        if not re.fullmatch(_DATACENTER, name):
            raise read.error(key, f"expected a datacenter name (1-100 of letters, digits, "
                             f"_ . -), got {name!r}")
        if isinstance(copies, bool) or not isinstance(copies, int) or not 1 <= copies <= 100:
            raise read.error(key, f"expected an integer in 1..100, got {_show(copies)}")
        factors.append((name, copies))
    return CassandraReplication(strategy, datacenters=tuple(factors))


def _check_datacenter(read: _Reader, settings: CassandraSettings) -> None:
    known = dict(settings.replication.datacenters)
    local = settings.local_datacenter
    if local is not None and known and local not in known:
        raise read.error(
            "onceflow.stores.cassandra.local-datacenter",
            f"expected one of the replication datacenters ({', '.join(known)}), got {local!r}",
        )


def _check_overlap(read: _Reader, settings: CassandraSettings) -> None:
    """Refuse a level whose reads could miss an acknowledged write (R + W <= RF).

    A load that misses the latest write of a state would fold events into a
    stale state after a rebalance: the events in between are lost.
    """
    level = settings.consistency
    needed = _FIXED_REPLICAS.get(level)
    if needed is None:
        return
    replication = settings.replication
    per_dc = dict(replication.datacenters)
    if replication.replication_factor is not None:
        copies = replication.replication_factor
    elif level == "LOCAL_ONE":
        copies = per_dc.get(settings.local_datacenter or "", max(per_dc.values()))
    else:
        copies = sum(per_dc.values())
    if needed > copies:
        problem = f"{level} needs {needed} replicas, the replication has {copies}"
    elif 2 * needed <= copies:
        problem = f"{level} reads can miss {level} writes with {copies} replicas"
    else:
        return
    raise read.error(
        "onceflow.stores.cassandra.consistency",
        f"expected QUORUM, LOCAL_QUORUM or ALL: {problem}, got {level!r}",
    )


class _Reader:
    """Typed, range-checked reads from the resolved tree, blaming the right source."""

    def __init__(self, tree: ConfigTree, origin: Callable[[str], str]) -> None:
        self._tree = tree
        self._origin = origin

    def error(self, key: str, expected: str) -> ConfigError:
        return ConfigError(self._origin(key), key, expected)

    def raw(self, key: str) -> object:
        return self._tree.get(key, None)

    def text(self, key: str, pattern: str = r".*\S.*", expected: str = "a non-empty string") -> str:
        value = self.raw(key)
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            raise self.error(key, f"expected {expected}, got {_show(value)}")
        return value

    def integer(self, key: str, low: int, high: int) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(key, f"expected an integer in {low}..{high}, got {_show(value)}")
        return value

    def boolean(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_show(value)}")
        return value

    def number(self, key: str, low: float, high: float) -> float:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not low <= value <= high:
            raise self.error(key, f"expected a number in {low}..{high}, got {_show(value)}")
        return float(value)

    def duration(self, key: str, low: float, high: float) -> float:
        value = self.raw(key)
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise self.error(
                key, f"expected a duration like 10s or 500ms, got {_show(value)}"
            ) from None
        if not low <= seconds <= high:
            expected = f"a duration in {_fmt(low)}..{_fmt(high)}"
            raise self.error(key, f"expected {expected}, got {_show(value)}")
        return seconds


_HOCON_ERRORS = (ParseBaseException, ConfigException, OSError)


def _hocon_error(label: str, exc: Exception) -> ConfigError:
    """One line for what pyhocon raised: a syntax error, a bad substitution or include."""
    if isinstance(exc, ParseBaseException):
        where = f"line {exc.lineno}, column {exc.col}"
        return ConfigError(label, None, f"{where}: syntax error: {exc.msg}")
    if isinstance(exc, OSError):  # include required("missing.conf")
        return ConfigError(label, None, f"cannot include: {exc}")
    return ConfigError(label, None, " ".join(str(exc).split()))  # pyhocon gives (line: N, col: M)


def _merge(base: ConfigTree, top: ConfigTree) -> ConfigTree:
    """Merge the unresolved ``top`` over the resolved ``base`` in place, as HOCON does.

    Not ConfigTree.merge_configs: that makes an app's ``key = ${?VAR}`` fall back
    to base's value instead of the app's own earlier one (chimpler/pyhocon#154).
    """
    for key, value in top.items():
        old = OrderedDict.get(base, key)  # ConfigTree.get would split quoted keys on dots
        if isinstance(old, ConfigTree) and isinstance(value, ConfigTree):
            _merge(old, value)
            continue
        if isinstance(value, ConfigValues):  # unset ${?VAR} falls back along overridden_value
            tail = value
            while isinstance(tail.overridden_value, ConfigValues):
                tail = tail.overridden_value
            if tail.overridden_value is None:
                tail.overridden_value = old
        OrderedDict.__setitem__(base, key, value)
        if base.root:  # pyhocon's self-reference fixup reads each root key's history
            base.history[key] = [*base.history.get(key, []), value]
    return base


def _resolve(tree: ConfigTree) -> ConfigTree:
    """Resolve substitutions in place, after fixing what pyhocon's own merges broke.

    pyhocon copies an object when a later one merges into it, but leaves its
    substitutions pointing at the old copy, so a nested ``key = ${?VAR}`` with
    VAR unset resolves to None instead of the earlier value (chimpler/pyhocon#331).
    """

    def relink(node: ConfigTree) -> None:
        for key, value in node.items():
            if isinstance(value, ConfigValues):
                value.parent, value.key = node, key
            elif isinstance(value, ConfigTree):
                relink(value)

    relink(tree)
    ConfigParser.resolve_substitutions(tree)
    return tree


def _apply_override(tree: ConfigTree, key: str, raw: str) -> None:
    """Put ``key = raw`` (one HOCON value, parsed on its own) into the resolved ``tree``."""
    if not key.startswith("onceflow."):
        raise ConfigError(OVERRIDES, key, "unknown key (settings live under 'onceflow.')")
    try:
        parsed = ConfigFactory.parse_string(f"value = {raw}")
    except _HOCON_ERRORS:
        parsed = None
    if parsed is None or list(parsed) != ["value"]:  # `a:1,b:2` is "a:1" plus a key `b`
        raise ConfigError(OVERRIDES, key, f"expected one HOCON value, got {raw!r} (quote it)")
    tree.put(key, parsed.get("value", None))


def _check_keys(
    tree: object, schema: ConfigTree, prefix: str, origin: Callable[[str], str]
) -> None:
    """Reject keys the reference does not know, and scalars where it has objects."""
    if not isinstance(tree, ConfigTree):
        raise ConfigError(origin(prefix), prefix, f"expected an object, got {_show(tree)}")
    for name, value in tree.items():
        key = f"{prefix}.{name}"
        if name not in schema:
            close = difflib.get_close_matches(name, list(schema), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(schema)
            raise ConfigError(origin(key), key, f"unknown key ({hint})")
        if isinstance(schema[name], ConfigTree):
            _check_keys(value, schema[name], key, origin)


def _declares(tree: ConfigTree, key: str) -> bool:
    """Whether ``tree`` (the unresolved application file) assigns ``key``."""
    node: object = tree
    for part in key.split("."):
        if not isinstance(node, ConfigTree) or part not in node:
            return False
        node = node[part]
    return True


def _fmt(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds * 1000:g}ms"


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return _fmt(value.total_seconds())
    relative = _relativedelta_seconds(value)
    if relative is not None:
        return _fmt(relative)
    if isinstance(value, ConfigTree):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return repr(value) if isinstance(value, str) else str(value)
