"""The worker on stores that want a login and TLS: Redis (requirepass, an ACL user, TLS
with client certificates) and Cassandra 2.1 (PasswordAuthenticator, client-to-node TLS).

A right login runs the robots pipeline exactly; a wrong one stops the worker at
start with exit 2 and the setting to fix; a login the store withdraws while the
worker runs stops it with exit 2 too, instead of retrying for minutes.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import redis
from cassandra.cluster import Cluster
from helpers import (
    SecureService,
    committed,
    create_topic,
    expected_counts,
    produce,
    start_worker,
    stored_states,
    wait_for_log,
)

from onceflow.analytics import readers
from onceflow.devtools.certs import LocalPki, make_pki
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo, free_port
from onceflow.runtime.secrets import Secret
from onceflow.stores.access import StoreAccess, TlsFiles, cassandra_options
from onceflow.stores.base import StateStore
from onceflow.stores.cassandra_store import CassandraStore
from onceflow.stores.redis_store import RedisStore

FAST_STATS = ["--set", "onceflow.metrics.stats-interval=200ms"]
R, C = "onceflow.stores.redis.", "onceflow.stores.cassandra."


def sets(prefix: str, values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f'{prefix}{key}="{value}"')]


def secret_file(tmp_path: Path, name: str, value: str) -> Path:
    path = tmp_path / name
    path.write_text(value + "\n")
    return path


def tls_files(pki: LocalPki, ca: Path | None = None) -> dict[str, str]:
    return {"tls.ca-file": str(ca or pki.ca_file), "tls.cert-file": str(pki.client_cert),
            "tls.key-file": str(pki.client_key)}


def finished(worker: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return worker.wait(timeout=timeout)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def stop(worker: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM and expect a clean exit 0."""
    worker.send_signal(signal.SIGTERM)
    assert finished(worker, timeout=15) == 0, log.read_text()[-3000:]


def totals(store: StateStore) -> dict[str, dict[str, int]]:
    try:
        return stored_states(store, "per_robot")
    finally:
        store.close()


# --- Redis -------------------------------------------------------------------


class RedisRun:
    """A robot topic, a group, a key prefix and an ACL user of its own on the secure Redis."""

    def __init__(self, kafka: ServiceInfo, secure: SecureService, tmp_path: Path,
                 unique_name: Callable[..., str]) -> None:
        self.kafka, self.secure, self.tmp_path = kafka, secure, tmp_path
        self.topic, self.group, self.prefix = unique_name("robots"), unique_name("g"), unique_name()
        self.user, self.password = unique_name("u"), uuid.uuid4().hex
        self.url = f"rediss://{secure.info.address}/0"
        with self.admin() as admin:
            admin.execute_command("ACL", "SETUSER", self.user, "on", f">{self.password}",
                                  "~*", "&*", "+@all")
        create_topic(kafka.address, self.topic, 4)

    def admin(self) -> redis.Redis:
        pki = self.secure.pki
        return redis.Redis(host=self.secure.info.host, port=self.secure.info.port,
                           password=self.secure.admin[1], ssl=True, ssl_ca_certs=str(pki.ca_file),
                           ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key))

    def start(self, log: str, login: dict[str, str], extra: Sequence[str] = ()
              ) -> subprocess.Popen[bytes]:
        return start_worker(self.kafka.address, self.url, self.group, self.prefix, self.topic,
                            self.tmp_path / log, [*sets(R, login), *FAST_STATS, *extra])

    def login(self, password: str | None = None, ca: Path | None = None) -> dict[str, str]:
        pw = secret_file(self.tmp_path, f"pw-{uuid.uuid4().hex[:6]}", password or self.password)
        return {"username": self.user, "password-file": str(pw), **tls_files(self.secure.pki, ca)}

    def totals(self) -> dict[str, dict[str, int]]:
        pki = self.secure.pki
        access = StoreAccess(self.user, Secret(self.password),
                             TlsFiles(str(pki.ca_file), str(pki.client_cert), str(pki.client_key),
                                      check_hostname=True))
        return totals(RedisStore(self.url, self.prefix, "robots", access=access))


@pytest.fixture
def redis_run(kafka_service: ServiceInfo, secure_redis_service: SecureService, tmp_path: Path,
              unique_name: Callable[..., str]) -> RedisRun:
    return RedisRun(kafka_service, secure_redis_service, tmp_path, unique_name)


def test_worker_on_redis_with_an_acl_user_and_tls_counts_exactly(redis_run: RedisRun) -> None:
    stream = generate(5_000, seed=21)
    ends = produce(redis_run.kafka.address, redis_run.topic, stream.messages)
    worker = redis_run.start("worker.log", redis_run.login())
    wait_for_log(worker, redis_run.tmp_path / "worker.log", "'records': 5000", timeout=90)

    stop(worker, redis_run.tmp_path / "worker.log")

    assert committed(redis_run.kafka.address, redis_run.group, redis_run.topic, 4) == {
        p: ends.get(p, 0) for p in range(4)}
    assert redis_run.totals() == expected_counts(stream.truth)
    assert redis_run.password not in (redis_run.tmp_path / "worker.log").read_text()
    plain = RedisStore(f"redis://{redis_run.secure.info.address}/0", "x", "robots",
                       access=StoreAccess(redis_run.user, Secret(redis_run.password)))
    assert plain.check_access() is not None  # this Redis speaks TLS only
    plain.close()


@pytest.mark.parametrize(("case", "key", "says"), [
    ("wrong password", R + "password", "it refused user '{user}' with a password: "),
    ("no login", R + "password", "it refused the default user with no password: "),
    ("foreign CA", R + "tls.ca-file", "expected the CA that signed redis's certificate: "),
])
def test_a_refused_redis_login_stops_the_worker_at_start_with_exit_2(
        redis_run: RedisRun, case: str, key: str, says: str) -> None:
    if case == "wrong password":
        login = redis_run.login(password="not-" + redis_run.password)
    elif case == "no login":
        login = tls_files(redis_run.secure.pki)
    else:  # another CA than the one that signed Redis's certificate
        login = redis_run.login(ca=make_pki(redis_run.tmp_path / "other-ca").ca_file)
    started = time.monotonic()
    worker = redis_run.start("worker.log", login)

    code = finished(worker, timeout=60)

    log = (redis_run.tmp_path / "worker.log").read_text()
    assert code == 2, log[-3000:]
    assert "onceflow: config error: " in log and f": {key}: " in log, log[-3000:]
    assert says.format(user=redis_run.user) in log
    assert "worker started" not in log and redis_run.password not in log
    assert time.monotonic() - started < 30  # not the store retries' 5 minutes


def test_a_login_withdrawn_while_running_stops_the_worker_with_exit_2(redis_run: RedisRun
                                                                      ) -> None:
    first = generate(2_000, seed=22)
    produce(redis_run.kafka.address, redis_run.topic, first.messages)
    worker = redis_run.start("worker.log", redis_run.login())
    log = redis_run.tmp_path / "worker.log"
    wait_for_log(worker, log, "'records': 2000", timeout=90)

    with redis_run.admin() as admin:
        admin.acl_deluser(redis_run.user)  # also closes the worker's connections
    produce(redis_run.kafka.address, redis_run.topic, generate(500, seed=23).messages)
    code = finished(worker, timeout=60)

    text = log.read_text()
    assert code == 2, text[-3000:]
    assert f": {R}password: expected a login redis accepts, it refused user " in text


# --- Cassandra ---------------------------------------------------------------


class CassandraRun:
    """A robot topic, a group, a keyspace and a login of its own on the secure Cassandra."""

    def __init__(self, kafka: ServiceInfo, secure: SecureService, tmp_path: Path,
                 unique_name: Callable[..., str]) -> None:
        self.kafka, self.secure, self.tmp_path = kafka, secure, tmp_path
        self.topic, self.group = unique_name("robots"), unique_name("g")
        self.keyspace, self.user = unique_name("ks"), unique_name("u")
        self.password = uuid.uuid4().hex
        self.no_redis = f"redis://127.0.0.1:{free_port()}/0"
        admin_user, admin_password = secure.admin
        assert admin_user is not None
        cluster = Cluster([secure.info.host], port=secure.info.port, protocol_version=3,
                          **cassandra_options(self.access(admin_user, admin_password)))
        try:
            cluster.connect().execute(
                f"CREATE USER {self.user} WITH PASSWORD '{self.password}' NOSUPERUSER")
        finally:
            cluster.shutdown()
        create_topic(kafka.address, self.topic, 4)

    def access(self, user: str, password: str) -> StoreAccess:
        return StoreAccess(user, Secret(password),
                           TlsFiles(str(self.secure.pki.ca_file), None, None, True))

    def store(self) -> CassandraStore:
        return CassandraStore([self.secure.info.host], "robots", port=self.secure.info.port,
                              keyspace=self.keyspace, protocol_version=3,
                              access=self.access(self.user, self.password))

    def start(self, log: str, password: str | None = None) -> subprocess.Popen[bytes]:
        pw = secret_file(self.tmp_path, f"pw-{uuid.uuid4().hex[:6]}", password or self.password)
        login = {"contact-points": self.secure.info.host, "keyspace": self.keyspace,
                 "username": self.user, "password-file": str(pw),
                 "tls.ca-file": str(self.secure.pki.ca_file)}
        extra = ["--set", f"{C}port={self.secure.info.port}", "--set", f"{C}tls.enabled=true"]
        return start_worker(self.kafka.address, self.no_redis, self.group, "unused", self.topic,
                            self.tmp_path / log, [*sets(C, login), *extra, *FAST_STATS])


@pytest.fixture
def cassandra_run(kafka_service: ServiceInfo, secure_cassandra_service: SecureService,
                  tmp_path: Path, unique_name: Callable[..., str],
                  monkeypatch: pytest.MonkeyPatch) -> CassandraRun:
    monkeypatch.setenv("ONCEFLOW_ROBOTS_STORE", "cassandra")  # read by start_worker's child
    return CassandraRun(kafka_service, secure_cassandra_service, tmp_path, unique_name)


def test_worker_on_cassandra_with_a_login_and_tls_counts_exactly(cassandra_run: CassandraRun
                                                                 ) -> None:
    stream = generate(5_000, seed=24)
    ends = produce(cassandra_run.kafka.address, cassandra_run.topic, stream.messages)
    worker = cassandra_run.start("worker.log")
    log = cassandra_run.tmp_path / "worker.log"
    wait_for_log(worker, log, "'records': 5000", timeout=120)

    stop(worker, log)

    assert committed(cassandra_run.kafka.address, cassandra_run.group, cassandra_run.topic,
                     4) == {p: ends.get(p, 0) for p in range(4)}
    assert totals(cassandra_run.store()) == expected_counts(stream.truth)
    plain = CassandraStore([cassandra_run.secure.info.host], "robots",
                           port=cassandra_run.secure.info.port, protocol_version=3,
                           connect_timeout=2, access=StoreAccess(
                               cassandra_run.user, Secret(cassandra_run.password)))
    assert plain.check_access() is not None  # this Cassandra speaks TLS only
    plain.close()


def test_a_wrong_cassandra_password_stops_the_worker_at_start_with_exit_2(
        cassandra_run: CassandraRun) -> None:
    worker = cassandra_run.start("worker.log", password="wrong")

    code = finished(worker, timeout=60)

    log = (cassandra_run.tmp_path / "worker.log").read_text()
    assert code == 2, log[-3000:]
    assert (f": {C}password: expected a login cassandra accepts, it refused user "
            f"'{cassandra_run.user}' with a password: ") in log, log[-3000:]
    assert "worker started" not in log


# --- analytics readers -------------------------------------------------------

HISTORY = {f"{start}|robot-{n}": f'{{"ok":{n}}}'.encode() for start in (0, 60_000)
           for n in range(50)}
WINDOWS = sorted(("per_robot", key.partition("|")[2], int(key.partition("|")[0]), True,
                  value.decode()) for key, value in HISTORY.items())


def test_the_analytics_readers_log_in_like_the_worker(redis_run: RedisRun,
                                                      cassandra_run: CassandraRun) -> None:
    """The Spark tasks' readers (called here as a task would) use the same StoreAccess."""
    pki = redis_run.secure.pki
    redis_access = StoreAccess(redis_run.user, Secret(redis_run.password), TlsFiles(
        str(pki.ca_file), str(pki.client_cert), str(pki.client_key), True))
    store = RedisStore(redis_run.url, redis_run.prefix, "fleet", access=redis_access)
    store.save("per_robot#history", HISTORY)
    store.close()
    source = readers.RedisSource(redis_run.url, redis_run.prefix, "fleet", redis_access)
    shards = readers.redis_shard_patterns(source, ["per_robot"], 4)
    assert sorted(readers.read_redis_shard(source, shards, ["per_robot"])) == WINDOWS

    cassandra = cassandra_run.store()
    cassandra.save("per_robot#history", HISTORY)
    cassandra.close()
    secure = cassandra_run.secure.info
    access = cassandra_run.access(cassandra_run.user, cassandra_run.password)
    c_source = readers.CassandraSource((secure.host,), secure.port, cassandra_run.keyspace,
                                       "robots", access=access)
    ranges = readers.ring_ranges(c_source, 4)
    assert sorted(readers.read_token_ranges(c_source, ranges, ["per_robot"])) == WINDOWS
