"""onceflow.kafka security settings: TLS and SASL parsed, checked at start, and handed
identically to every aiokafka client the worker makes; secret values never shown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from tls_certs import Certs, make_ca, make_certs

from onceflow.kafka.tail_reader import tail_options
from onceflow.runtime import topics
from onceflow.runtime.config import ConfigError, Settings, load_settings
from onceflow.runtime.kafka_security import KWARGS, PLAINTEXT, client_kwargs
from onceflow.runtime.wiring import consumer_options, producer_options
from onceflow.stages.pipeline import Pipeline

PIPELINE = 'onceflow.pipeline = "shop.orders:pipeline"\n'
SASL_PASSWORD = "sasl-pw-7Hq2"
K = "onceflow.kafka."


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ONCEFLOW_KAFKA_SSL_KEY_PASSWORD", "ONCEFLOW_KAFKA_SASL_USERNAME",
                 "ONCEFLOW_KAFKA_SASL_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def load(tmp_path: Path, text: str, overrides: dict[str, str] | None = None) -> Settings:
    path = tmp_path / "app.conf"
    path.write_text(PIPELINE + text, encoding="utf-8")
    return load_settings(path, overrides)


def error(tmp_path: Path, text: str, overrides: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text, overrides)
    return str(caught.value)


def mutual_tls(certs: Certs, password_file: Path) -> str:
    password_file.write_text(certs.client_key_password + "\n", encoding="utf-8")
    return (f'{K}security-protocol = SSL\n{K}ssl.ca-file = "{certs.ca}"\n'
            f'{K}ssl.cert-file = "{certs.client_cert}"\n{K}ssl.key-file = "{certs.client_key}"\n'
            f'{K}ssl.key-password-file = "{password_file}"\n')


def sasl_ssl(certs: Certs) -> str:
    return (f'{K}security-protocol = SASL_SSL\n{K}ssl.ca-file = "{certs.ca}"\n'
            f'{K}sasl-mechanism = SCRAM-SHA-512\n{K}sasl.username = "worker"\n'
            f'{K}sasl.password = ${{?ONCEFLOW_KAFKA_SASL_PASSWORD}}\n')


# --- what loads ---------------------------------------------------------------


def test_the_default_is_plaintext(tmp_path: Path) -> None:
    settings = load(tmp_path, "")
    assert settings.kafka.security == PLAINTEXT
    assert client_kwargs(settings.kafka.security) == {"security_protocol": "PLAINTEXT"}


def test_mutual_tls_with_an_encrypted_key(tmp_path: Path, certs: Certs) -> None:
    security = load(tmp_path, mutual_tls(certs, tmp_path / "key-pw")).kafka.security
    kwargs = client_kwargs(security)
    context = kwargs["ssl_context"]
    assert kwargs["security_protocol"] == "SSL" and isinstance(context, ssl.SSLContext)
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert "sasl_plain_password" not in kwargs
    assert certs.client_key_password not in repr(security)


def test_check_hostname_can_be_turned_off(tmp_path: Path, certs: Certs) -> None:
    security = load(tmp_path, f'{K}security-protocol = SSL\n{K}ssl.ca-file = "{certs.ca}"\n'
                    f"{K}ssl.check-hostname = false\n").kafka.security
    context = client_kwargs(security)["ssl_context"]
    assert not context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED


def test_sasl_ssl_with_scram_and_the_password_from_the_environment(
    tmp_path: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_KAFKA_SASL_PASSWORD", SASL_PASSWORD)
    security = load(tmp_path, sasl_ssl(certs)).kafka.security
    kwargs = client_kwargs(security)
    assert {k: kwargs[k] for k in KWARGS if k != "ssl_context"} == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "worker", "sasl_plain_password": SASL_PASSWORD}
    assert SASL_PASSWORD not in repr(security)


# --- every client gets the same arguments --------------------------------------


def test_every_kafka_client_is_made_with_the_security_arguments(
    tmp_path: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Consumer (its connection checker asks through it), producer, tail reader, admin."""
    monkeypatch.setenv("ONCEFLOW_KAFKA_SASL_PASSWORD", SASL_PASSWORD)
    settings = load(tmp_path, sasl_ssl(certs))
    made: dict[str, Any] = {}

    class Admin(AIOKafkaAdminClient):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            made["admin"] = self._client
            raise RuntimeError("stop before connecting")

    monkeypatch.setattr(topics, "AIOKafkaAdminClient", Admin)
    pipeline = Pipeline("p", topics=("in",)).repartition("r", key=str).aggregate(
        "a", key=str, init=dict, fold=lambda s, v: s)
    with pytest.raises(RuntimeError, match="stop before connecting"):
        asyncio.run(topics.ensure_repartition_topics("127.0.0.1:1", pipeline, 1,
                                                     settings.kafka.security))

    async def build() -> None:
        made["consumer"] = AIOKafkaConsumer(**consumer_options(settings))._client
        made["tail"] = AIOKafkaConsumer(**tail_options(consumer_options(settings)))._client
        made["producer"] = AIOKafkaProducer(**producer_options(settings)).client

    asyncio.run(build())
    assert set(made) == {"admin", "consumer", "tail", "producer"}
    for name, client in made.items():
        got = (client._security_protocol, client._sasl_mechanism, client._sasl_plain_username,
               client._sasl_plain_password, type(client._ssl_context))
        assert got == ("SASL_SSL", "SCRAM-SHA-512", "worker", SASL_PASSWORD,
                       ssl.SSLContext), name


def test_the_tail_reader_keeps_every_security_argument() -> None:
    options = {**dict.fromkeys(KWARGS, "x"), "group_id": "g"}
    kept = tail_options(options)
    assert all(kept[k] == "x" for k in KWARGS) and "group_id" not in kept


# --- what is refused, with file: key: expected ----------------------------------


def test_a_missing_ca_file(tmp_path: Path) -> None:
    assert error(tmp_path, f'{K}security-protocol = SSL\n{K}ssl.ca-file = "/no/ca.pem"\n') == (
        f"{tmp_path}/app.conf: {K}ssl.ca-file: expected a PEM file, got '/no/ca.pem' "
        "(no such file)")


def test_a_ca_file_that_is_not_pem(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    message = error(tmp_path, f'{K}security-protocol = SSL\n'
                    f'{K}ssl.ca-file = "{tmp_path / "ca.pem"}"\n')
    assert message.startswith(f"{tmp_path}/app.conf: {K}ssl.ca-file: expected a PEM file of "
                              f"CA certificates, got '{tmp_path / 'ca.pem'}' (")


def test_an_encrypted_key_without_its_password(tmp_path: Path, certs: Certs) -> None:
    text = mutual_tls(certs, tmp_path / "pw").replace(f"{K}ssl.key-password-file", "# ")
    assert error(tmp_path, text) == (
        f"{tmp_path}/app.conf: {K}ssl.key-password: expected the password of the encrypted "
        f"key in '{certs.client_key}', got none")


def test_a_wrong_key_password_is_not_shown(tmp_path: Path, certs: Certs) -> None:
    text = mutual_tls(certs, tmp_path / "pw")
    (tmp_path / "pw").write_text("wrong-pw-Zz9")
    message = error(tmp_path, text)
    assert message == (f"{tmp_path}/app.conf: {K}ssl.key-password: expected the password of "
                       f"the encrypted key in '{certs.client_key}', got one that does not open "
                       "it (value not shown)")
    assert "wrong-pw-Zz9" not in message and certs.client_key_password not in message


def test_a_certificate_with_another_key(tmp_path: Path, certs: Certs) -> None:
    text = (f'{K}security-protocol = SSL\n{K}ssl.cert-file = "{certs.client_cert}"\n'
            f'{K}ssl.key-file = "{certs.server_key}"\n')
    assert error(tmp_path, text).startswith(
        f"{tmp_path}/app.conf: {K}ssl.cert-file: expected a PEM client certificate whose key "
        f"is in ssl.key-file (or in the same file), got '{certs.client_cert}' (")


def test_a_key_without_a_certificate(tmp_path: Path, certs: Certs) -> None:
    assert error(tmp_path, f'{K}security-protocol = SSL\n'
                 f'{K}ssl.key-file = "{certs.server_key}"\n').endswith(
        f"{K}ssl.key-file: expected with ssl.cert-file (the client certificate the key "
        "belongs to), got no cert-file")


def test_tls_settings_without_tls_are_refused(tmp_path: Path, certs: Certs) -> None:
    assert error(tmp_path, f'{K}ssl.ca-file = "{certs.ca}"\n') == (
        f"{tmp_path}/app.conf: {K}ssl.ca-file: set, but security-protocol is PLAINTEXT: "
        "expected security-protocol SSL or SASL_SSL to use it, or remove it")


def test_sasl_settings_without_sasl_are_refused(tmp_path: Path, certs: Certs) -> None:
    assert error(tmp_path, f'{K}sasl.username = "u"\n').endswith(
        f"{K}sasl.username: set, but security-protocol is PLAINTEXT: expected "
        "security-protocol SASL_PLAINTEXT or SASL_SSL to use it, or remove it")


def test_sasl_without_a_username(tmp_path: Path) -> None:
    assert error(tmp_path, f"{K}security-protocol = SASL_PLAINTEXT\n") == (
        f"{tmp_path}/app.conf: {K}sasl.username: expected a username with security-protocol "
        "SASL_PLAINTEXT, got null")


def test_sasl_without_a_password(tmp_path: Path) -> None:
    assert error(tmp_path, f'{K}security-protocol = SASL_PLAINTEXT\n'
                 f'{K}sasl.username = "u"\n').endswith(
        f"{K}sasl.password: expected a password with security-protocol SASL_PLAINTEXT "
        "(sasl.password from the environment, or sasl.password-file), got none")


def test_a_sasl_password_on_the_command_line_is_refused_and_not_echoed(tmp_path: Path) -> None:
    message = error(tmp_path, f'{K}security-protocol = SASL_PLAINTEXT\n{K}sasl.username = "u"\n',
                    {f"{K}sasl.password": f'"{SASL_PASSWORD}"'})
    assert message.startswith(f"<overrides>: {K}sasl.password: expected a secret from a file")
    assert SASL_PASSWORD not in message


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("security-protocol", "TLS", "expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, "
     "got 'TLS'"),
    ("sasl-mechanism", "GSSAPI", "expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, "
     "got 'GSSAPI'"),
    ("ssl.check-hostname", "maybe", "expected true or false, got 'maybe'"),
])
def test_bad_values(tmp_path: Path, key: str, value: str, expected: str) -> None:
    assert error(tmp_path, f"{K}{key} = {value}\n") == f"{tmp_path}/app.conf: {K}{key}: {expected}"


def test_a_ca_that_did_not_sign_the_broker_is_a_verify_error(tmp_path: Path,
                                                              certs: Certs) -> None:
    """A context with another CA refuses the server certificate (what the e2e test sees)."""
    other_ca, _ = make_ca(tmp_path, "other-ca")
    security = load(tmp_path, f'{K}security-protocol = SSL\n'
                    f'{K}ssl.ca-file = "{other_ca}"\n').kafka.security
    context = client_kwargs(security)["ssl_context"]
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs.server_cert, certs.server_key)
    client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
    client = context.wrap_bio(client_in, client_out, server_hostname="127.0.0.1")
    peer = server.wrap_bio(server_in, server_out, server_side=True)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        for _ in range(10):
            for side in (client, peer):
                with contextlib.suppress(ssl.SSLWantReadError):
                    side.do_handshake()
            server_in.write(client_out.read())
            client_in.write(server_out.read())


# --- no message shows a secret --------------------------------------------------


@pytest.mark.parametrize("raw", ["a:1,b:2", "x}y"])
def test_an_unparsable_secret_override_is_not_echoed(tmp_path: Path, raw: str) -> None:
    message = error(tmp_path, "", {f"{K}sasl.password": raw})
    assert message == (f"<overrides>: {K}sasl.password: expected one HOCON value, got a value "
                       "(not shown: a secret) (quote it)")


def test_a_secret_of_the_wrong_type_is_not_echoed(tmp_path: Path) -> None:
    message = error(tmp_path, f"{K}security-protocol = SASL_SSL\n{K}sasl.password = 7391\n")
    assert "7391" not in message and message.endswith("(value not shown)")


def test_a_url_password_is_masked_in_messages(tmp_path: Path) -> None:
    message = error(tmp_path, 'onceflow.stores.redis.url = "redis//:url-pw-55@host:6379"\n')
    assert message.endswith("got 'redis//:****@host:6379'") and "url-pw-55" not in message


def test_debug_logs_of_sasl_exchanges_hide_their_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka logs each request at DEBUG; a PLAIN SaslAuthenticate carries the password."""
    from aiokafka.protocol.admin import SaslAuthenticateRequest_v1

    monkeypatch.setenv("ONCEFLOW_KAFKA_SASL_PASSWORD", SASL_PASSWORD)
    security = load(tmp_path, f'{K}security-protocol = SASL_PLAINTEXT\n'
                    f'{K}sasl.username = "u"\n').kafka.security
    client_kwargs(security)  # installs the filter, as making any SASL client does
    request = SaslAuthenticateRequest_v1(f"\0u\0{SASL_PASSWORD}".encode())
    with caplog.at_level("DEBUG", logger="aiokafka.conn"):
        logging.getLogger("aiokafka.conn").debug("Request to %s:%d %d: %s", "h", 1, 7, request)
    assert caplog.messages == ["Request to h:1 7: SaslAuthenticate(bytes hidden)"]
