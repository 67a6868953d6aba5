"""onceflow.runtime.config: defaults, precedence, and one exact message per kind of mistake."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from importlib import resources
from pathlib import Path

import pytest

from onceflow.runtime.config import (
    AnalyticsSettings,
    CassandraReplication,
    CassandraSettings,
    CommitSettings,
    ConfigError,
    ConnectionCheckerSettings,
    ConsumerSettings,
    KafkaSettings,
    LandingSettings,
    MetricsSettings,
    PersistenceSettings,
    ProducerSettings,
    RedisSettings,
    Settings,
    ShutdownSettings,
    SparkSettings,
    StateSettings,
    StoresSettings,
    SupervisionSettings,
    load_settings,
    parse_duration,
)
from onceflow.runtime.kafka_security import PLAINTEXT
from onceflow.stores.access import NO_ACCESS, StoreAccess, TlsFiles

EXAMPLE_CONF = Path(__file__).resolve().parents[2] / "config" / "example.conf"
DEMO_CONF = Path(str(resources.files("onceflow.examples").joinpath("demo.conf")))
ENV_VARS = (
    "ONCEFLOW_PIPELINE",
    "ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS",
    "ONCEFLOW_KAFKA_GROUP_ID",
    "ONCEFLOW_REDIS_URL",
    "ONCEFLOW_CASSANDRA_CONTACT_POINTS",
    "ONCEFLOW_REDIS_USERNAME",
    "ONCEFLOW_REDIS_PASSWORD",
    "ONCEFLOW_CASSANDRA_USERNAME",
    "ONCEFLOW_CASSANDRA_PASSWORD",
)
PIPELINE = 'onceflow.pipeline = "shop.orders:pipeline"\n'

AppFile = Callable[[str], Path]

# reference.conf's onceflow.analytics block (the settings have no defaults of their own).
REFERENCE_ANALYTICS = AnalyticsSettings(
    spark=SparkSettings(master="local[*]", app_name="onceflow-analytics", driver_memory="1g",
                        executor_memory="1g", shuffle_partitions=8, ui_enabled=True, conf=()),
    out="onceflow-analytics", top_n=10, anomaly_k=2.0, min_events=3, cassandra_splits=8,
    redis_shards=8,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own ONCEFLOW_* variables must not leak into these tests."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def app_file(tmp_path: Path) -> AppFile:
    """Write an application file and return its path."""

    def write(text: str) -> Path:
        path = tmp_path / "app.conf"
        path.write_text(text, encoding="utf-8")
        return path

    return write


def error_for(path: Path, overrides: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_settings(path, overrides)
    return caught.value


# --- what loads ---------------------------------------------------------------


def test_only_the_pipeline_is_required(app_file: AppFile) -> None:
    path = app_file(PIPELINE)

    assert load_settings(path) == Settings(
        pipeline="shop.orders:pipeline",
        source=str(path),
        kafka=KafkaSettings(
            bootstrap_servers="127.0.0.1:9092",
            group_id="onceflow",
            client_id="onceflow-worker",
            auto_offset_reset="earliest",
            session_timeout=10.0,
            heartbeat_interval=3.0,
            request_timeout=30.0,
            max_poll_records=2000,
            fetch_max_wait=0.1,
            dead_letter_topic="onceflow-dead-letters",
            late_events_topic="onceflow-late-events",
            repartition_replication_factor=1,
            connection_checker=ConnectionCheckerSettings(
                enable=True, max_retries=3, check_interval=15.0, backoff_factor=2.0),
            producer=ProducerSettings(
                max_block=60.0, metadata_max_age=300.0, delivery_timeout=120.0,
                request_timeout=30.0,
                retries=2_147_483_647, retry_backoff=0.1, reconnect_backoff=0.05,
                reconnect_backoff_max=1.0, max_in_flight=1, linger=0.005, batch_size=1_048_576,
                outbox_store="auto"),
            join_timeout=120.0,
            security=PLAINTEXT,
            dead_letter_max_value=524_288,
            isolation_level="read_committed",
        ),
        consumer=ConsumerSettings(4, gap_refetches=5, gap_refetch_backoff=0.1, rewind_grace=30.0),
        persistence=PersistenceSettings(interval=1.0),
        state=StateSettings(max_cached_states=500_000),
        commit=CommitSettings(interval=5.0),
        stores=StoresSettings(
            redis=RedisSettings("redis://127.0.0.1:6379/0", "onceflow", NO_ACCESS),
            cassandra=CassandraSettings(
                contact_points=("127.0.0.1",),
                port=9042,
                keyspace="onceflow",
                replication=CassandraReplication("SimpleStrategy", replication_factor=1),
                protocol_version=3,
                local_datacenter=None,
                consistency="LOCAL_QUORUM",
                connect_timeout=5.0,
                request_timeout=10.0,
                concurrency=128,
                access=NO_ACCESS,
            ),
        ),
        shutdown=ShutdownSettings(timeout=10.0),
        metrics=MetricsSettings(stats_interval=5.0, port=0, host="127.0.0.1", stall_timeout=60.0),
        landing=LandingSettings(dir=None),
        analytics=REFERENCE_ANALYTICS,
        supervision=SupervisionSettings(
            policy="rest_for_one", max_restarts=5, within=60.0, backoff_initial=1.0,
            backoff_max=30.0, backoff_jitter=1.0, escalation_grace=0.0),
        single_worker=False,
        pipeline_settings={},
    )


def test_application_file_overrides_defaults(app_file: AppFile) -> None:
    path = app_file(
        PIPELINE
        + """
        onceflow {
          kafka {
            bootstrap-servers = "k1:9092,k2:9092"
            auto-offset-reset = latest
            session-timeout = 2m
            heartbeat-interval = "1.5s"
            max-poll-records = 10
            repartition-replication-factor = 3
          }
          single-worker = true
          consumer { max-in-flight-batches = 16, gap-refetches = 0, gap-refetch-backoff = 20ms }
          persistence.interval = 500ms
          state { cache.max-states = 50, history.retention = 30d, max-bytes = 65536 }
          stores.redis { url = "rediss://cache:6380/2", key-prefix = "shop", wait-replicas = 2,
                         wait-timeout = 250ms }
        }
        """
    )

    settings = load_settings(path)

    assert settings.kafka.bootstrap_servers == "k1:9092,k2:9092"
    assert settings.kafka.auto_offset_reset == "latest"
    assert settings.kafka.session_timeout == 120.0
    assert settings.kafka.heartbeat_interval == 1.5
    assert settings.kafka.max_poll_records == 10
    assert settings.kafka.repartition_replication_factor == 3
    assert settings.single_worker is True
    # Untouched keys keep their defaults, even a `${?VAR}` one beside the app's
    # own kafka keys (pyhocon alone turns it into None: chimpler/pyhocon#331).
    assert settings.kafka.group_id == "onceflow"
    assert settings.consumer == ConsumerSettings(16, gap_refetches=0, gap_refetch_backoff=0.02,
                                                 rewind_grace=30.0)
    assert settings.persistence.interval == 0.5
    assert settings.state == StateSettings(max_cached_states=50, history_retention=30 * 86400,
                                           max_state_bytes=65536)
    assert settings.stores.redis == RedisSettings(  # rediss://: TLS, the system's CAs
        "rediss://cache:6380/2", "shop", StoreAccess(tls=TlsFiles(None, None, None, True)),
        wait_replicas=2, wait_timeout=0.25)


def test_environment_beats_reference_defaults(
    app_file: AppFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_PIPELINE", "env.mod:pipe")
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setenv("ONCEFLOW_KAFKA_GROUP_ID", "env-group")
    monkeypatch.setenv("ONCEFLOW_REDIS_URL", "redis://redis:6379/0")

    settings = load_settings(app_file("# nothing but the environment\n"))

    assert settings.pipeline == "env.mod:pipe"
    assert settings.kafka.bootstrap_servers == "kafka:9092"
    assert settings.kafka.group_id == "env-group"
    assert settings.stores.redis.url == "redis://redis:6379/0"


def test_application_file_beats_environment(
    app_file: AppFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
    path = app_file(PIPELINE + 'onceflow.kafka.bootstrap-servers = "app:9092"\n')

    assert load_settings(path).kafka.bootstrap_servers == "app:9092"


@pytest.mark.parametrize(("env", "expected"), [("kafka:9092", "kafka:9092"), (None, "app:9092")])
def test_application_file_can_defer_to_environment(
    app_file: AppFile, monkeypatch: pytest.MonkeyPatch, env: str | None, expected: str
) -> None:
    if env is not None:
        monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS", env)
    path = app_file(
        PIPELINE
        + """
        onceflow.kafka {
          bootstrap-servers = "app:9092"
          bootstrap-servers = ${?ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS}
          client-id = shop
        }
        """
    )

    # With VAR unset the app's own value stays, not the reference's (chimpler/pyhocon#154).
    assert load_settings(path).kafka.bootstrap_servers == expected


def test_overrides_are_applied_last(app_file: AppFile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
    path = app_file(PIPELINE + "onceflow.commit.interval = 3s\n")

    settings = load_settings(
        path,
        {
            "onceflow.kafka.bootstrap-servers": "127.0.0.1:1234",
            "onceflow.commit.interval": "250ms",
            "onceflow.consumer.max-in-flight-batches": "2",
        },
    )

    assert settings.kafka.bootstrap_servers == "127.0.0.1:1234"
    assert settings.commit.interval == 0.25
    assert settings.consumer.max_in_flight_batches == 2


def test_substitutions_and_includes_resolve_across_files(app_file: AppFile, tmp_path: Path) -> None:
    (tmp_path / "common.conf").write_text('shared-prefix = "shop"\n')
    path = app_file(
        'include "common.conf"\n'
        + PIPELINE
        + "onceflow.kafka.client-id = ${onceflow.kafka.group-id}-worker\n"
        + "onceflow.stores.redis.key-prefix = ${shared-prefix}\n"
    )

    settings = load_settings(path)

    assert settings.kafka.client_id == "onceflow-worker"
    assert settings.stores.redis.key_prefix == "shop"


@pytest.mark.parametrize("path", [EXAMPLE_CONF, DEMO_CONF], ids=["example", "demo"])
def test_shipped_config_files_load(path: Path) -> None:
    settings = load_settings(path)

    assert settings.pipeline == "onceflow.examples.robots:pipeline"


def test_demo_config_is_fast() -> None:
    settings = load_settings(DEMO_CONF)

    assert (settings.kafka.session_timeout, settings.kafka.heartbeat_interval) == (6.0, 2.0)
    assert (settings.persistence.interval, settings.commit.interval) == (0.5, 2.0)


def test_example_config_defers_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setenv("ONCEFLOW_REDIS_URL", "redis://redis:6379/0")
    monkeypatch.setenv("ONCEFLOW_CASSANDRA_CONTACT_POINTS", "cassandra")

    settings = load_settings(EXAMPLE_CONF)

    assert settings.kafka.bootstrap_servers == "kafka:9092"
    assert settings.stores.redis.url == "redis://redis:6379/0"
    assert settings.stores.cassandra.contact_points == ("cassandra",)


def test_cassandra_settings_from_the_application_file(app_file: AppFile) -> None:
    path = app_file(
        PIPELINE
        + """
        onceflow.stores.cassandra {
          contact-points = ["10.0.0.1", "cass-2.internal"]
          port = 19042
          keyspace = shop_states
          replication {
            class = NetworkTopologyStrategy
            datacenters { dc1 = 3, "eu-west" = 2 }
          }
          protocol-version = 0
          local-datacenter = dc1
          consistency = QUORUM
          connect-timeout = 2s
          request-timeout = 1500ms
          concurrency = 32
        }
        """
    )

    cassandra = load_settings(path).stores.cassandra

    assert cassandra == CassandraSettings(
        contact_points=("10.0.0.1", "cass-2.internal"),
        port=19042,
        keyspace="shop_states",
        replication=CassandraReplication(
            "NetworkTopologyStrategy", datacenters=(("dc1", 3), ("eu-west", 2))
        ),
        protocol_version=0,
        local_datacenter="dc1",
        consistency="QUORUM",
        connect_timeout=2.0,
        request_timeout=1.5,
        concurrency=32,
        access=NO_ACCESS,
    )
    assert cassandra.replication.cql_options() == {
        "class": "NetworkTopologyStrategy", "dc1": 3, "eu-west": 2,
    }


def test_cassandra_simple_strategy_replication_map(app_file: AppFile) -> None:
    path = app_file(PIPELINE + "onceflow.stores.cassandra.replication.replication-factor = 3\n")

    replication = load_settings(path).stores.cassandra.replication

    assert replication.cql_options() == {"class": "SimpleStrategy", "replication_factor": 3}


@pytest.mark.parametrize(
    ("level", "replication"),
    [
        ("ONE", "replication-factor = 1"),
        ("TWO", "replication-factor = 3"),
        ("ALL", "replication-factor = 5"),
        ("LOCAL_ONE", "class = NetworkTopologyStrategy, datacenters { dc1 = 1, dc2 = 3 }"),
        ("QUORUM", "class = NetworkTopologyStrategy, datacenters { dc1 = 3, dc2 = 3 }"),
    ],
)
def test_cassandra_levels_whose_reads_see_every_write(
    app_file: AppFile, level: str, replication: str
) -> None:
    path = app_file(
        PIPELINE
        + f"onceflow.stores.cassandra.consistency = {level}\n"
        + f"onceflow.stores.cassandra.replication {{ {replication} }}\n"
        + ("onceflow.stores.cassandra.local-datacenter = dc1\n" if "dc1" in replication else "")
    )

    assert load_settings(path).stores.cassandra.consistency == level


@pytest.mark.parametrize(
    ("env", "expected"),
    [("c1,c2", ("c1", "c2")), ("c1, c2 ,c3", ("c1", "c2", "c3")), ("single", ("single",))],
)
def test_cassandra_contact_points_from_the_environment(
    app_file: AppFile, monkeypatch: pytest.MonkeyPatch, env: str, expected: tuple[str, ...]
) -> None:
    monkeypatch.setenv("ONCEFLOW_CASSANDRA_CONTACT_POINTS", env)

    settings = load_settings(app_file(PIPELINE))

    assert settings.stores.cassandra.contact_points == expected


def test_cassandra_overrides_as_the_tests_give_them(app_file: AppFile) -> None:
    settings = load_settings(
        app_file(PIPELINE),
        {
            "onceflow.stores.cassandra.contact-points": '["127.0.0.1"]',
            "onceflow.stores.cassandra.port": "40123",
            "onceflow.stores.cassandra.keyspace": '"ks_1"',
            "onceflow.stores.cassandra.local-datacenter": '"datacenter1"',
        },
    )

    assert settings.stores.cassandra.port == 40123
    assert settings.stores.cassandra.keyspace == "ks_1"
    assert settings.stores.cassandra.local_datacenter == "datacenter1"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("500ms", 0.5),
        ("10s", 10.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        (" 250 ms ", 0.25),
        ("100us", 0.0001),
        (timedelta(seconds=3), 3.0),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["soon", "10", "-1s", "10 parsecs", "", 10, 1.5, None, True])
def test_parse_duration_refuses_what_is_not_a_duration(value: object) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(value)


# --- what is refused, and how it reads ----------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.conf"

    err = error_for(path)

    assert str(err) == f"{path}: file not found"
    assert (err.file, err.key) == (str(path), None)


def test_syntax_error_names_line_and_column(app_file: AppFile) -> None:
    path = app_file('onceflow {\n  pipeline = "a:b"\n  kafka { group-id = [ }\n}\n')

    err = error_for(path)

    assert str(err) == f"{path}: line 3, column 24: syntax error: Expected ']'"
    assert err.key is None


def test_unknown_key_suggests_the_closest(app_file: AppFile) -> None:
    path = app_file(PIPELINE + "onceflow.kafka.sesion-timeout = 5s\n")

    err = error_for(path)

    assert str(err) == (
        f"{path}: onceflow.kafka.sesion-timeout: unknown key (did you mean 'session-timeout'?)"
    )
    assert (err.file, err.key) == (str(path), "onceflow.kafka.sesion-timeout")


def test_unknown_key_without_a_close_match_lists_the_known_ones(app_file: AppFile) -> None:
    path = app_file(PIPELINE + "onceflow.stores.mongo.hosts = [a]\n")

    assert str(error_for(path)) == (
        f"{path}: onceflow.stores.mongo: unknown key (known: redis, cassandra)"
    )


def test_keys_outside_onceflow_are_left_alone(app_file: AppFile) -> None:
    path = app_file(PIPELINE + "my-app.feature-flag = true\n")

    assert load_settings(path).pipeline == "shop.orders:pipeline"


def test_scalar_where_a_section_belongs(app_file: AppFile) -> None:
    path = app_file(PIPELINE + "onceflow.kafka = 3\n")

    assert str(error_for(path)) == f"{path}: onceflow.kafka: expected an object, got 3"


@pytest.mark.parametrize(
    ("line", "key", "expected"),
    [
        (
            'single-worker = "yes"',
            "onceflow.single-worker",
            "expected true or false, got 'yes'",
        ),
        (
            "kafka.repartition-replication-factor = 0",
            "onceflow.kafka.repartition-replication-factor",
            "expected an integer in 1..32767, got 0",
        ),
        (
            "state.cache.max-states = 0",
            "onceflow.state.cache.max-states",
            "expected an integer in 1..1000000000, got 0",
        ),
        (
            "state.cache.max-states = 2000000000",
            "onceflow.state.cache.max-states",
            "expected an integer in 1..1000000000, got 2000000000",
        ),
        (
            "state.max-bytes = 20000000",
            "onceflow.state.max-bytes",
            "expected an integer in 1024..16777216, got 20000000",
        ),
        (
            "windows.idle-timeout = 500ms",
            "onceflow.windows.idle-timeout",
            "expected a duration in 1s..7d, got 500ms",
        ),
        (
            "windows.idle-timeout = 8d",
            "onceflow.windows.idle-timeout",
            "expected a duration in 1s..7d, got 8d",
        ),
        (
            "windows.max-future = 500ms",
            "onceflow.windows.max-future",
            "expected a duration in 1s..3650d, got 500ms",
        ),
        (
            "state.history.retention = 500ms",
            "onceflow.state.history.retention",
            "expected 0s (keep forever) or a duration in 1s..7300d, got 500ms",
        ),
        (
            "state.history.retention = 7301d",
            "onceflow.state.history.retention",
            "expected 0s (keep forever) or a duration in 1s..7300d, got 7301d",
        ),
        (
            "state.history.retention = 30",
            "onceflow.state.history.retention",
            "expected a duration like 10s or 500ms, got 30",
        ),
        (
            "consumer.max-in-flight-batches = 0",
            "onceflow.consumer.max-in-flight-batches",
            "expected an integer in 1..1000, got 0",
        ),
        (
            "consumer.gap-refetches = -1",
            "onceflow.consumer.gap-refetches",
            "expected an integer in 0..100, got -1",
        ),
        (
            "consumer.gap-refetch-backoff = 1m",
            "onceflow.consumer.gap-refetch-backoff",
            "expected a duration in 0ms..10s, got 1m",
        ),
        (
            "consumer.rewind-grace = 0s",
            "onceflow.consumer.rewind-grace",
            "expected a duration in 1s..1h, got 0ms",
        ),
        (
            "kafka.dead-letter-max-value = -1",
            "onceflow.kafka.dead-letter-max-value",
            "expected an integer in 0..67108864, got -1",
        ),
        (
            'kafka.max-poll-records = "many"',
            "onceflow.kafka.max-poll-records",
            "expected an integer in 1..100000, got 'many'",
        ),
        (
            "kafka.max-poll-records = 2.5",
            "onceflow.kafka.max-poll-records",
            "expected an integer in 1..100000, got 2.5",
        ),
        (
            "kafka.session-timeout = soon",
            "onceflow.kafka.session-timeout",
            "expected a duration like 10s or 500ms, got 'soon'",
        ),
        (
            "kafka.session-timeout = 10",
            "onceflow.kafka.session-timeout",
            "expected a duration like 10s or 500ms, got 10",
        ),
        (
            "kafka.session-timeout = 10m",
            "onceflow.kafka.session-timeout",
            "expected a duration in 1s..5m, got 10m",
        ),
        (
            "persistence.interval = 5ms",
            "onceflow.persistence.interval",
            "expected a duration in 10ms..1h, got 5ms",
        ),
        (
            "commit.interval = {every = 5s}",
            "onceflow.commit.interval",
            "expected a duration like 10s or 500ms, got an object",
        ),
        (
            "kafka.auto-offset-reset = newest",
            "onceflow.kafka.auto-offset-reset",
            "expected one of 'earliest', 'latest', got 'newest'",
        ),
        (
            "kafka.group-id = null",
            "onceflow.kafka.group-id",
            "expected a non-empty string, got null",
        ),
        (
            'kafka.bootstrap-servers = "kafka"',
            "onceflow.kafka.bootstrap-servers",
            "expected 'host:port[,host:port]', got 'kafka'",
        ),
        (
            'stores.redis.url = "http://cache:6379"',
            "onceflow.stores.redis.url",
            "expected a redis://, rediss:// or unix:// URL, got 'http://cache:6379'",
        ),
        (
            "stores.redis.wait-replicas = -1",
            "onceflow.stores.redis.wait-replicas",
            "expected an integer in 0..100, got -1",
        ),
        (
            "stores.redis.wait-timeout = 0s",  # WAIT 0 would wait for ever
            "onceflow.stores.redis.wait-timeout",
            "expected a duration in 10ms..1m, got 0ms",
        ),
        (
            "stores.cassandra.contact-points = []",
            "onceflow.stores.cassandra.contact-points",
            "expected a non-empty list of hosts, or one comma-separated string of them, got []",
        ),
        (
            "stores.cassandra.contact-points = [1, 2]",
            "onceflow.stores.cassandra.contact-points",
            "expected a non-empty list of hosts, or one comma-separated string of them, "
            "got a list",
        ),
        (
            'stores.cassandra.contact-points = "a,,b"',
            "onceflow.stores.cassandra.contact-points",
            "expected a non-empty list of hosts, or one comma-separated string of them, "
            "got 'a,,b'",
        ),
        (
            "stores.cassandra.port = 70000",
            "onceflow.stores.cassandra.port",
            "expected an integer in 1..65535, got 70000",
        ),
        (
            'stores.cassandra.keyspace = "Shop-States"',
            "onceflow.stores.cassandra.keyspace",
            "expected a keyspace name: a lowercase letter, then up to 47 of [a-z0-9_], "
            "got 'Shop-States'",
        ),
        (
            "stores.cassandra.keyspace = " + "k" * 49,
            "onceflow.stores.cassandra.keyspace",
            "expected a keyspace name: a lowercase letter, then up to 47 of [a-z0-9_], "
            "got '" + "k" * 49 + "'",
        ),
        (
            "stores.cassandra.replication.class = LocalStrategy",
            "onceflow.stores.cassandra.replication.class",
            "expected one of 'SimpleStrategy', 'NetworkTopologyStrategy', got 'LocalStrategy'",
        ),
        (
            "stores.cassandra.replication.replication-factor = 0",
            "onceflow.stores.cassandra.replication.replication-factor",
            "expected an integer in 1..100, got 0",
        ),
        (
            "stores.cassandra.replication.datacenters { dc1 = 3 }",
            "onceflow.stores.cassandra.replication.datacenters",
            "expected null with SimpleStrategy "
            "(set class = NetworkTopologyStrategy to list datacenters)",
        ),
        (
            "stores.cassandra.replication.class = NetworkTopologyStrategy",
            "onceflow.stores.cassandra.replication.datacenters",
            "expected copies per datacenter with NetworkTopologyStrategy, e.g. {dc1 = 3}, "
            "got null",
        ),
        (
            "stores.cassandra.replication { class = NetworkTopologyStrategy, "
            "datacenters { dc1 = three } }",
            "onceflow.stores.cassandra.replication.datacenters.dc1",
            "expected an integer in 1..100, got 'three'",
        ),
        (
            "stores.cassandra.protocol-version = 2",
            "onceflow.stores.cassandra.protocol-version",
            "expected 0 (let the driver negotiate) or 3..5, got 2",
        ),
        (
            "stores.cassandra.protocol-version = 6",
            "onceflow.stores.cassandra.protocol-version",
            "expected an integer in 0..5, got 6",
        ),
        (
            "stores.cassandra.local-datacenter = 3",
            "onceflow.stores.cassandra.local-datacenter",
            "expected null or a datacenter name, got 3",
        ),
        (
            "stores.cassandra { local-datacenter = dc9, replication { "
            "class = NetworkTopologyStrategy, datacenters { dc1 = 3 } } }",
            "onceflow.stores.cassandra.local-datacenter",
            "expected one of the replication datacenters (dc1), got 'dc9'",
        ),
        (
            "stores.cassandra.consistency = ANY",
            "onceflow.stores.cassandra.consistency",
            "expected one of 'ONE', 'TWO', 'THREE', 'QUORUM', 'ALL', 'LOCAL_ONE', "
            "'LOCAL_QUORUM', got 'ANY'",
        ),
        (
            "stores.cassandra.consistency = local_quorum",
            "onceflow.stores.cassandra.consistency",
            "expected one of 'ONE', 'TWO', 'THREE', 'QUORUM', 'ALL', 'LOCAL_ONE', "
            "'LOCAL_QUORUM', got 'local_quorum'",
        ),
        (
            "stores.cassandra { consistency = ONE, replication.replication-factor = 3 }",
            "onceflow.stores.cassandra.consistency",
            "expected QUORUM, LOCAL_QUORUM or ALL: ONE reads can miss ONE writes "
            "with 3 replicas, got 'ONE'",
        ),
        (
            "stores.cassandra.consistency = TWO",
            "onceflow.stores.cassandra.consistency",
            "expected QUORUM, LOCAL_QUORUM or ALL: TWO needs 2 replicas, "
            "the replication has 1, got 'TWO'",
        ),
        (
            "stores.cassandra.request-timeout = 10",
            "onceflow.stores.cassandra.request-timeout",
            "expected a duration like 10s or 500ms, got 10",
        ),
        (
            "stores.cassandra.connect-timeout = 10m",
            "onceflow.stores.cassandra.connect-timeout",
            "expected a duration in 100ms..5m, got 10m",
        ),
        (
            "stores.cassandra.concurrency = 0",
            "onceflow.stores.cassandra.concurrency",
            "expected an integer in 1..1024, got 0",
        ),
        (
            "stores.cassandra.conistency = ONE",
            "onceflow.stores.cassandra.conistency",
            "unknown key (did you mean 'consistency'?)",
        ),
        (
            "kafka.producer.max-in-flight = 5",
            "onceflow.kafka.producer.max-in-flight",
            "expected 1 (without idempotent producers, which Tansu lacks, a second batch in "
            "flight can overtake a failed one, and downstream dedup would drop the re-sent "
            "records), got 5",
        ),
        (
            "kafka.consumer.isolation-level = READ_COMMITTED",
            "onceflow.kafka.consumer.isolation-level",
            "expected one of 'read_committed', 'read_uncommitted', got 'READ_COMMITTED'",
        ),
        (
            "kafka.producer.outbox-store = mongo",
            "onceflow.kafka.producer.outbox-store",
            "expected one of auto, redis, cassandra, none, got 'mongo'",
        ),
        (
            "kafka.producer.reconnect-backoff-max = 10ms",
            "onceflow.kafka.producer.reconnect-backoff-max",
            "expected a duration at least reconnect-backoff (50ms), got 10ms",
        ),
    ],
)
def test_wrong_type_or_range(app_file: AppFile, line: str, key: str, expected: str) -> None:
    path = app_file(PIPELINE + f"onceflow.{line}\n")

    err = error_for(path)

    assert str(err) == f"{path}: {key}: {expected}"
    assert (err.file, err.key, err.expected) == (str(path), key, expected)


def test_missing_pipeline(app_file: AppFile) -> None:
    path = app_file("onceflow.kafka.group-id = shop\n")

    assert str(error_for(path)) == (
        f"{path}: onceflow.pipeline: missing: "
        "set it to 'module:attribute' naming a onceflow.stages.Pipeline"
    )


def test_malformed_pipeline(app_file: AppFile) -> None:
    path = app_file('onceflow.pipeline = "shop.orders"\n')

    assert str(error_for(path)) == (
        f"{path}: onceflow.pipeline: expected 'module:attribute' naming a "
        "onceflow.stages.Pipeline, got 'shop.orders'"
    )


@pytest.mark.parametrize("heartbeat", ["10s", "12s"])
def test_heartbeat_must_be_shorter_than_session_timeout(app_file: AppFile, heartbeat: str) -> None:
    path = app_file(PIPELINE + f"onceflow.kafka.heartbeat-interval = {heartbeat}\n")

    assert str(error_for(path)) == (
        f"{path}: onceflow.kafka.heartbeat-interval: "
        f"expected a duration below session-timeout (10s), got {heartbeat}"
    )


def test_join_timeout_defaults_to_two_minutes_and_is_read(app_file: AppFile) -> None:
    assert load_settings(app_file(PIPELINE)).kafka.join_timeout == 120.0
    path = app_file(PIPELINE + "onceflow.kafka.join-timeout = 30s\n")
    assert load_settings(path).kafka.join_timeout == 30.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5s", "expected a duration at least session-timeout (10s), got 5s"),
        ("2h", "expected a duration in 1s..1h, got 2h"),
        ("120", "expected a duration like 10s or 500ms, got 120"),
    ],
)
def test_join_timeout_range(app_file: AppFile, value: str, expected: str) -> None:
    path = app_file(PIPELINE + f"onceflow.kafka.join-timeout = {value}\n")

    assert str(error_for(path)) == f"{path}: onceflow.kafka.join-timeout: {expected}"


def test_unresolvable_substitution_names_the_application_line(app_file: AppFile) -> None:
    path = app_file(PIPELINE + "onceflow.kafka.group-id = ${nowhere}\n")

    assert (
        str(error_for(path)) == f"{path}: Cannot resolve variable ${{nowhere}} (line: 2, col: 27)"
    )


@pytest.mark.parametrize(
    ("name", "value", "key", "expected"),
    [
        ("ONCEFLOW_PIPELINE", "nocolon", "onceflow.pipeline", "expected 'module:attribute'"),
        (
            "ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS",
            "kafka",
            "onceflow.kafka.bootstrap-servers",
            "expected 'host:port[,host:port]'",
        ),
        ("ONCEFLOW_KAFKA_GROUP_ID", " ", "onceflow.kafka.group-id", "expected a non-empty"),
        ("ONCEFLOW_REDIS_URL", "cache:6379", "onceflow.stores.redis.url", "expected a redis://"),
        (
            "ONCEFLOW_CASSANDRA_CONTACT_POINTS",
            "c1,",
            "onceflow.stores.cassandra.contact-points",
            "expected a non-empty list of hosts",
        ),
    ],
)
def test_bad_environment_value_is_blamed_on_the_variable(
    app_file: AppFile,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    value: str,
    key: str,
    expected: str,
) -> None:
    monkeypatch.setenv(name, value)
    text = "" if name == "ONCEFLOW_PIPELINE" else PIPELINE

    err = error_for(app_file(text))

    assert (err.file, err.key) == (f"${name}", key)
    assert str(err).startswith(f"${name}: {key}: {expected}")


def test_bad_override_is_blamed_on_the_overrides(app_file: AppFile) -> None:
    path = app_file(PIPELINE)

    assert str(error_for(path, {"onceflow.kafka.fetch-max-wait": "2m"})) == (
        "<overrides>: onceflow.kafka.fetch-max-wait: expected a duration in 0ms..1m, got 2m"
    )
    assert str(error_for(path, {"onceflow.kafka.group-ids": "x"})) == (
        "<overrides>: onceflow.kafka.group-ids: unknown key (did you mean 'group-id'?)"
    )
    assert str(error_for(path, {"kafka.group-id": "x"})) == (
        "<overrides>: kafka.group-id: unknown key (settings live under 'onceflow.')"
    )
    assert str(error_for(path, {"onceflow.kafka.bootstrap-servers": "a:1,b:2"})) == (
        "<overrides>: onceflow.kafka.bootstrap-servers: "
        "expected one HOCON value, got 'a:1,b:2' (quote it)"
    )


def test_the_window_idle_timeout_defaults_to_five_minutes_and_is_read(app_file: AppFile
                                                                       ) -> None:
    assert load_settings(app_file(PIPELINE)).windows.idle_timeout == 300.0
    path = app_file(PIPELINE + "onceflow.windows.idle-timeout = 90s\n")
    assert load_settings(path).windows.idle_timeout == 90.0


def test_the_window_max_future_defaults_to_an_hour_and_is_read(app_file: AppFile) -> None:
    assert load_settings(app_file(PIPELINE)).windows.max_future == 3600.0
    path = app_file(PIPELINE + "onceflow.windows.max-future = 2d\n")
    assert load_settings(path).windows.max_future == 2 * 86400.0


# --- landing zone and analytics -----------------------------------------------


def test_landing_is_off_and_analytics_has_defaults(app_file: AppFile) -> None:
    settings = load_settings(app_file(PIPELINE))

    assert settings.landing == LandingSettings(dir=None)
    assert settings.analytics == REFERENCE_ANALYTICS
    assert settings.analytics.spark.master == "local[*]"


def test_analytics_and_landing_from_the_application_file(app_file: AppFile) -> None:
    path = app_file(PIPELINE + """
onceflow.landing.dir = "/data/landing"
onceflow.analytics {
  spark {
    master = "spark://spark-master:7077"
    app-name = fleet
    driver-memory = 2g
    executor-memory = 4g
    shuffle-partitions = 64
    ui-enabled = false
    executor-wait = 2m
    conf { "spark.executor.cores" = 2, "spark.sql.adaptive.enabled" = true }
  }
  out = /data/analytics
  top-n = 5
  anomaly-k = 3
  min-events = 10
  cassandra-splits = 128
  redis-shards = 16
}
""")
    settings = load_settings(path)

    assert settings.landing == LandingSettings("/data/landing")
    assert settings.analytics == AnalyticsSettings(
        spark=SparkSettings(master="spark://spark-master:7077", app_name="fleet",
                            driver_memory="2g", executor_memory="4g", shuffle_partitions=64,
                            ui_enabled=False,
                            conf=(("spark.executor.cores", "2"),
                                  ("spark.sql.adaptive.enabled", "true")),
                            executor_wait=120.0),
        out="/data/analytics", top_n=5, anomaly_k=3.0, min_events=10, cassandra_splits=128,
        redis_shards=16,
    )


@pytest.mark.parametrize(
    ("line", "key", "expected"),
    [
        ("onceflow.analytics.spark.master = moon", "onceflow.analytics.spark.master",
         "expected local, local[N], local[*] or a cluster URL such as spark://host:7077, "
         "got 'moon'"),
        ("onceflow.analytics.spark.driver-memory = lots",
         "onceflow.analytics.spark.driver-memory",
         "expected a JVM memory size such as 512m or 2g, got 'lots'"),
        ("onceflow.analytics.spark.executor-wait = 0s",
         "onceflow.analytics.spark.executor-wait", "expected a duration in 1s..1d, got 0ms"),
        ("onceflow.analytics.spark.ui-enabled = maybe", "onceflow.analytics.spark.ui-enabled",
         "expected true or false, got 'maybe'"),
        ('onceflow.analytics.spark.conf { "executor.cores" = 2 }',
         'onceflow.analytics.spark.conf."executor.cores"',
         "expected a spark.* key with a string, number or boolean value, got 2"),
        ("onceflow.analytics.anomaly-k = 0", "onceflow.analytics.anomaly-k",
         "expected a number in (0, 100], got 0"),
        ("onceflow.analytics.redis-shards = 300", "onceflow.analytics.redis-shards",
         "expected an integer in 1..256, got 300"),
        ("onceflow.landing.dir = 3", "onceflow.landing.dir",
         "expected a non-empty string, got 3"),
    ],
)
def test_bad_analytics_settings(app_file: AppFile, line: str, key: str, expected: str) -> None:
    err = error_for(app_file(PIPELINE + line + "\n"))

    assert (err.key, err.expected) == (key, expected)


def test_durations_parse_when_dateutil_is_installed() -> None:
    """pyhocon yields relativedelta instead of timedelta once python-dateutil is importable."""
    relativedelta = pytest.importorskip("dateutil.relativedelta").relativedelta

    assert parse_duration(relativedelta(seconds=6)) == 6.0
    assert parse_duration(relativedelta(microseconds=500_000)) == 0.5
    with pytest.raises(ValueError):
        parse_duration(relativedelta(months=1))


def test_a_factory_is_called_with_the_pipeline_settings(app_file: AppFile) -> None:
    from onceflow.runtime.wiring import load_pipeline

    path = app_file('onceflow.pipeline = "onceflow.examples.orders:build"\n'
                    'onceflow.pipeline-settings { topic = "eu-orders", '
                    'repartition-topic = "eu-by-customer", store = cassandra }\n')
    settings = load_settings(path)
    assert settings.pipeline_settings == {"topic": "eu-orders", "repartition-topic":
                                          "eu-by-customer", "store": "cassandra"}
    pipeline = load_pipeline(settings)
    assert pipeline.consumed_topics == ("eu-orders", "eu-by-customer")
    assert [a.store for a in pipeline.aggregates] == ["cassandra"]


@pytest.mark.parametrize("store", ["redis", "cassandra"])
def test_the_history_retention_reaches_the_stores(app_file: AppFile, store: str) -> None:
    from onceflow.runtime.wiring import open_store

    settings = load_settings(app_file(PIPELINE + "onceflow.state.history.retention = 2d\n"))
    default = load_settings(app_file(PIPELINE))

    assert open_store(settings, store, "p").history_retention == 2 * 86400
    assert open_store(default, store, "p").history_retention == 0  # clients connect lazily


@pytest.mark.parametrize("text", ["512m", '"512m"', "90m", "2g", '"2g"', "1024k"])
def test_a_memory_size_means_the_same_quoted_or_not(app_file: AppFile, text: str) -> None:
    """pyhocon reads an unquoted 512m as 512 minutes; the memory keys read it as 512 MB,
    in the file and in --set (issue 31: it exited 2 with 'expected ... 512m, got 512m')."""
    size = text.strip('"')
    in_file = load_settings(app_file(PIPELINE + f"onceflow.analytics.spark.executor-memory = "
                                                f"{text}\n"))
    assert in_file.analytics.spark.executor_memory == size
    overridden = load_settings(app_file(PIPELINE),
                               {"onceflow.analytics.spark.driver-memory": text})
    assert overridden.analytics.spark.driver_memory == size
