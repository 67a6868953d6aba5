"""Store credentials and TLS: the settings, the drivers' arguments, and refusals that
are never retried (no network: the drivers' own exception objects)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import pykka
import pytest
import redis
from cassandra import AuthenticationFailed, OperationTimedOut, Unauthorized
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import NoHostAvailable

from onceflow.actors.supervisor import ChildSpec, Policy, RestartSettings, Supervisor
from onceflow.runtime.config import ConfigError, load_settings
from onceflow.runtime.secrets import Secret
from onceflow.runtime.wiring import access_error, check_store_access
from onceflow.stages.pipeline import Pipeline
from onceflow.stores.access import (
    StoreAccess,
    StoreAccessDenied,
    TlsFiles,
    access_denied,
    cassandra_options,
    redis_options,
)
from onceflow.stores.retry import retrying

PIPELINE = 'onceflow.pipeline = "shop.orders:pipeline"\n'
R, C = "onceflow.stores.redis.", "onceflow.stores.cassandra."
AppFile = Callable[[str], Path]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS_URL", "REDIS_USERNAME", "REDIS_PASSWORD", "CASSANDRA_USERNAME",
                 "CASSANDRA_PASSWORD"):
        monkeypatch.delenv(f"ONCEFLOW_{name}", raising=False)


@pytest.fixture
def app_file(tmp_path: Path) -> AppFile:
    def write(text: str) -> Path:
        path = tmp_path / "app.conf"
        path.write_text(PIPELINE + text)
        return path

    return write


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")  # only its existence is checked here
    return path


def test_redis_login_and_tls_from_the_file_and_a_password_file(
        app_file: AppFile, pem: Path, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    path = app_file(f'{R}url = "rediss://cache:6380/0"\n{R}username = worker\n'
                    f'{R}password-file = "{tmp_path / "pw"}"\n{R}tls.ca-file = "{pem}"\n'
                    f"{R}tls.check-hostname = false\n")

    redis_settings = load_settings(path).stores.redis

    assert redis_settings.access == StoreAccess(
        "worker", Secret("s3cret"), TlsFiles(str(pem), None, None, False))
    assert "s3cret" not in repr(redis_settings)
    assert redis_options(redis_settings.access) == {
        "username": "worker", "password": "s3cret", "ssl_ca_certs": str(pem),
        "ssl_certfile": None, "ssl_keyfile": None, "ssl_check_hostname": False}


def test_store_passwords_come_from_the_environment(
        app_file: AppFile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_REDIS_PASSWORD", "from-env")
    monkeypatch.setenv("ONCEFLOW_CASSANDRA_USERNAME", "app")
    monkeypatch.setenv("ONCEFLOW_CASSANDRA_PASSWORD", "cass-env")

    stores = load_settings(app_file("")).stores

    assert stores.redis.access == StoreAccess(None, Secret("from-env"), None)
    assert stores.cassandra.access == StoreAccess("app", Secret("cass-env"), None)


def test_cassandra_login_and_tls(app_file: AppFile, pem: Path, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("cass")
    path = app_file(f'{C}username = app\n{C}password-file = "{tmp_path / "pw"}"\n'
                    f'{C}tls {{ enabled = true, ca-file = "{pem}", cert-file = "{pem}" }}\n')

    access = load_settings(path).stores.cassandra.access

    assert access == StoreAccess("app", Secret("cass"), TlsFiles(str(pem), str(pem), None, True))
    provider = cassandra_options(StoreAccess("app", Secret("cass")))["auth_provider"]
    assert isinstance(provider, PlainTextAuthProvider)
    assert (provider.username, provider.password) == ("app", "cass")


@pytest.mark.parametrize(("lines", "key", "expected"), [
    (f'{R}tls.ca-file = "PEM"', R + "url", f"expected a rediss:// URL with {R}tls set, "
     "got redis://"),
    (f'{R}url = "rediss://h:1/0"\n{R}tls.ca-file = "/nowhere/ca.pem"', R + "tls.ca-file",
     "expected a readable PEM file, got '/nowhere/ca.pem': No such file or directory"),
    (f'{R}url = "rediss://h:1/0"\n{R}tls.key-file = "PEM"', R + "tls.cert-file",
     "expected the client certificate of key-file, got null"),
    (f'{R}url = "redis://:pw@h:1/0"\n{R}password = "pw"', R + "password",
     "expected the password in the url or in password, not both (one in the url wins, and "
     "shows wherever the url does)"),
    (f"{R}username = 7", R + "username", "expected null or a name, got 7"),
    (f"{C}username = app", C + "password",
     "expected both username and password (PasswordAuthenticator), or neither"),
    (f'{C}password = "x"', C + "username",
     "expected both username and password (PasswordAuthenticator), or neither"),
    (f'{C}tls.ca-file = "PEM"', C + "tls.enabled", "expected true when tls files are set, "
     "got false"),
    (f"{C}tls.enabled = yes", C + "tls.enabled", "expected true or false, got 'yes'"),
])
def test_bad_store_access_settings(app_file: AppFile, pem: Path, lines: str, key: str,
                                   expected: str) -> None:
    path = app_file(lines.replace("PEM", str(pem)) + "\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert (caught.value.key, caught.value.expected) == (key, expected)


def test_a_store_password_on_the_command_line_is_refused(app_file: AppFile) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(app_file(""), {R + "password": "hunter2"})
    assert caught.value.key == R + "password" and "hunter2" not in str(caught.value)


def _wrapped(outer: BaseException, inner: BaseException) -> BaseException:
    """``outer`` raised while handling ``inner`` (its __context__), as redis-py does."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904  # the implicit context is the point
    except BaseException as error:
        return error


def _alert(reason: str) -> ssl.SSLError:
    error = ssl.SSLError(1, f"[SSL: {reason}] alert")
    error.reason = reason  # as OpenSSL's errors carry it
    return error


@pytest.mark.parametrize(("error", "store", "refused"), [
    (redis.AuthenticationError("WRONGPASS invalid username-password pair"), "redis",
     "credentials"),
    (redis.exceptions.NoPermissionError("NOPERM this user has no permissions"), "redis",
     "permission"),
    (_wrapped(redis.ConnectionError("Error 1 connecting"),
              ssl.SSLCertVerificationError("certificate verify failed")), "redis", "tls"),
    (_wrapped(redis.ConnectionError("Error while reading"), _alert(
        "TLSV13_ALERT_CERTIFICATE_REQUIRED")), "redis", "certificate"),
    (NoHostAvailable("Unable to connect to any servers",
                     {"127.0.0.1:9042": AuthenticationFailed("Bad credentials")}),
     "cassandra", "credentials"),
    (Unauthorized("User app has no CREATE permission"), "cassandra", "permission"),
])
def test_refusals_are_recognised_through_the_drivers_wrapping(
        error: BaseException, store: str, refused: str) -> None:
    denied = access_denied(error)
    assert denied is not None and (denied.store, denied.refused) == (store, refused)


@pytest.mark.parametrize("error", [
    redis.ConnectionError("Connection refused"), redis.TimeoutError("Timeout"),
    NoHostAvailable("Unable to connect", {"127.0.0.1:9042": OperationTimedOut("timed out")}),
    ConnectionRefusedError(111, "refused"),
    ssl.SSLCertVerificationError("certificate verify failed"),  # not under a store's driver
    _wrapped(redis.ConnectionError("Error while reading"), _alert("WRONG_VERSION_NUMBER")),
])
def test_an_unreachable_store_is_not_a_refusal(error: BaseException) -> None:
    assert access_denied(error) is None


def test_a_refusal_is_not_retried_and_comes_out_as_store_access_denied() -> None:
    attempts = []

    def login() -> None:
        attempts.append(1)
        raise redis.AuthenticationError("WRONGPASS invalid username-password pair")

    with pytest.raises(StoreAccessDenied) as caught:
        retrying("load per_robot", login)
    assert len(attempts) == 1
    assert isinstance(caught.value.__cause__, redis.AuthenticationError)


def test_a_refusal_names_the_setting_to_fix(app_file: AppFile, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("wrong")
    settings = load_settings(app_file(f'{R}username = worker\n{R}password-file = "{tmp_path}/pw"'))

    error = access_error(settings, StoreAccessDenied("redis", "credentials", "WRONGPASS x"))

    assert (error.key, error.expected) == (
        R + "password",
        "expected a login redis accepts, it refused user 'worker' with a password: WRONGPASS x")
    assert access_error(settings, StoreAccessDenied("cassandra", "tls", "verify failed")
                        ).key == C + "tls.ca-file"


def test_the_supervisor_escalates_a_refusal_at_once() -> None:
    escalated: list[str] = []
    reports: list[Callable[[str, BaseException], None]] = []

    class Child:
        def stop(self) -> None:
            pass

    def start(report: Callable[[str, BaseException], None]) -> Child:
        reports.append(report)
        return Child()

    settings = RestartSettings(Policy.ONE_FOR_ONE, max_restarts=5, within=60,
                               backoff_initial=0.01, backoff_max=1.0, backoff_jitter=0)
    ref = Supervisor.start([ChildSpec("core", start)], settings,
                           lambda name, error: escalated.append(name),
                           permanent=lambda error: access_denied(error) is not None)
    try:
        reports[0]("core", StoreAccessDenied("redis", "credentials", "WRONGPASS"))
        ref.proxy().states().get(timeout=5)  # the failure message was handled before this
        assert escalated == ["core"] and len(reports) == 1  # never restarted
    finally:
        pykka.ActorRegistry.stop_all()


@pytest.mark.parametrize("store", ["redis", "cassandra"])
def test_a_store_that_does_not_answer_at_start_is_left_to_the_retries(
        app_file: AppFile, store: str, caplog: pytest.LogCaptureFixture) -> None:
    pipeline = Pipeline("p", topics=("t",)).aggregate(
        "count", key=str, init=int, fold=lambda n, _: n + 1, store=store)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket is closed
    settings = load_settings(app_file(""), {
        R + "url": f"redis://127.0.0.1:{port}/0", C + "port": str(port),
        C + "protocol-version": "3", C + "connect-timeout": "1s"})

    check_store_access(settings, pipeline)  # no ConfigError: not a refusal

    assert f"store {store} does not answer yet" in caplog.text
