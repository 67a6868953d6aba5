"""The local services start, answer their real protocols, and stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from cassandra.cluster import Cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from onceflow.devtools import services
from onceflow.devtools.services import ServiceInfo
from onceflow.devtools.services_manager import ServicesManager, cli


def test_kafka_produce_and_consume(
    kafka_service: ServiceInfo, unique_name: Callable[..., str]
) -> None:
    topic, group = unique_name("topic"), unique_name("group")

    async def scenario() -> list[tuple[bytes | None, bytes | None]]:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_service.address, enable_idempotence=False
        )
        await producer.start()
        try:
            for i in range(3):
                await producer.send_and_wait(topic, f"v{i}".encode(), key=b"k")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_service.address, group_id=group,
            auto_offset_reset="earliest", enable_auto_commit=False,
            session_timeout_ms=6000, heartbeat_interval_ms=2000,
        )
        await consumer.start()
        try:
            got: list[tuple[bytes | None, bytes | None]] = []
            async with asyncio.timeout(30):
                while len(got) < 3:
                    batches = await consumer.getmany(timeout_ms=1000)
                    got += [(r.key, r.value) for recs in batches.values() for r in recs]
            await consumer.commit()
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(scenario()) == [(b"k", b"v0"), (b"k", b"v1"), (b"k", b"v2")]


def test_redis_set_get(redis_service: ServiceInfo, unique_name: Callable[..., str]) -> None:
    key = unique_name("key")
    client = redis.Redis(host=redis_service.host, port=redis_service.port)
    try:
        assert client.set(key, b"value")
        assert client.get(key) == b"value"
    finally:
        client.close()


def test_cassandra_table_round_trip(
    cassandra_service: ServiceInfo, unique_name: Callable[..., str]
) -> None:
    keyspace = unique_name("ks")
    cluster = Cluster([cassandra_service.host], port=cassandra_service.port, protocol_version=3)
    try:
        session = cluster.connect()
        session.execute(
            f"CREATE KEYSPACE {keyspace} WITH replication = "
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        )
        session.execute(f"CREATE TABLE {keyspace}.totals (key text PRIMARY KEY, total bigint)")
        session.execute(f"INSERT INTO {keyspace}.totals (key, total) VALUES (%s, %s)", ("a", 42))
        row = session.execute(f"SELECT total FROM {keyspace}.totals WHERE key = %s", ("a",)).one()
        assert row.total == 42
    finally:
        cluster.shutdown()


def test_manager_up_status_down(tmp_path: Path) -> None:
    manager = ServicesManager(tmp_path / "state")
    names = ("kafka", "redis")
    ports = {name: services.free_port() for name in names}
    started = manager.up(names, ports)
    try:
        assert {name: info.port for name, info in started.items()} == ports
        assert manager.status(names) == started
        assert manager.up(names) == started  # idempotent: reuses the running processes
        assert (tmp_path / "state" / "services.json").is_file()
    finally:
        manager.down(names)
    assert manager.status(names) == {"kafka": None, "redis": None}
    assert not any(services.is_up(info) for info in started.values())


def test_cli_status_and_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    info = ServicesManager(state).up(["redis"], {"redis": services.free_port()})["redis"]
    try:
        assert cli(["status", "--state-dir", str(state), "--only", "redis,kafka"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out == [f"redis     {info.address:<16}(pid {info.pid})", "kafka     not running"]
    finally:
        assert cli(["down", "--state-dir", str(state)]) == 0
    assert not services.is_up(info)


def test_freeze_thaw_then_stop_frozen(tmp_path: Path, unique_name: Callable[..., str]) -> None:
    info = services.start_redis(tmp_path / "redis")
    client = redis.Redis(  # redis-py retries timeouts 10 times by default: not here
        host=info.host, port=info.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    try:
        client.set(unique_name("key"), b"1")
        services.freeze(info)
        with pytest.raises(redis.TimeoutError):
            client.ping()
        services.thaw(info)
        assert client.ping()
        services.freeze(info)
    finally:
        client.close()
        services.stop(info)  # a frozen service still stops
    assert not services.is_up(info)


def test_a_cassandra_that_hangs_during_start_up_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A JVM that stops writing its log before it is ready is killed and started once more.

    The hang is real: the first process is SIGSTOPped right after it spawns.
    """
    spawned: list[ServiceInfo] = []
    spawn = services._spawn
    patient = services._CASSANDRA_STALL

    def spawn_first_one_frozen(*args: object) -> ServiceInfo:
        info = spawn(*args)  # type: ignore[arg-type]
        if not spawned:
            services.freeze(info)
        else:  # the real start-up: a loaded machine may pause its log for seconds
            monkeypatch.setattr(services, "_CASSANDRA_STALL", patient)
        spawned.append(info)
        return info

    monkeypatch.setattr(services, "_spawn", spawn_first_one_frozen)
    monkeypatch.setattr(services, "_CASSANDRA_STALL", 3.0)
    info = services.start_cassandra(tmp_path / "cassandra")
    try:
        assert len(spawned) == 2 and not services.is_up(spawned[0])
        assert info.pid == spawned[1].pid
        cluster = Cluster([info.host], port=info.port, protocol_version=3)
        try:
            assert cluster.connect().execute("SELECT release_version FROM system.local").one()
        finally:
            cluster.shutdown()
        assert "hung during start-up" in caplog.text
    finally:
        services.stop(info)
