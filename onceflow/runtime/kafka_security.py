"""How every Kafka client of a worker encrypts and authenticates: one place for all.

The consumer (and its connection checker, which asks through it), the
producer, the admin client that creates repartition topics and the group-less
tail reader of exclusive outputs all take their security arguments from
:func:`client_kwargs`, so they can never disagree: a worker whose producer
spoke TLS while its admin client did not would fail half-way through a start.

The TLS context is built each time the worker builds its clients' options (at
start and on each supervised restart), so a certificate renewed on disk is
picked up by the next restart; the SASL password is revealed only in the
arguments handed to aiokafka.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from typing import Any, Literal

from aiokafka.helpers import create_ssl_context

from onceflow.runtime.secrets import Secret

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
PROTOCOLS: tuple[SecurityProtocol, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS: tuple[SaslMechanism, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: aiokafka's argument names that client_kwargs may set.
KWARGS = ("security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_username",
          "sasl_plain_password")


@dataclass(frozen=True)
class KafkaSsl:
    """``onceflow.kafka.ssl``: PEM files; no CA file means the system's trusted CAs."""

    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    key_password: Secret | None
    check_hostname: bool


@dataclass(frozen=True)
class KafkaSasl:
    """``onceflow.kafka.sasl`` and ``sasl-mechanism``."""

    mechanism: SaslMechanism
    username: str | None
    password: Secret | None


@dataclass(frozen=True)
class KafkaSecurity:
    """``onceflow.kafka.security-protocol`` with its TLS and SASL settings."""

    protocol: SecurityProtocol
    ssl: KafkaSsl
    sasl: KafkaSasl

    @property
    def uses_ssl(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


#: No encryption, no authentication: Kafka's default, and the local broker's.
PLAINTEXT = KafkaSecurity("PLAINTEXT", KafkaSsl(None, None, None, None, True),
                          KafkaSasl("PLAIN", None, None))


def ssl_context(settings: KafkaSsl) -> ssl.SSLContext:
    """The client TLS context: verifies the broker's certificate, optionally presents ours.

    Raises:
        ssl.SSLError, OSError: a file cannot be read, is not PEM, or the key
            does not open with the password (or needs one and none is set:
            OpenSSL would otherwise prompt on the terminal).
    """
    password = settings.key_password

    def key_password() -> str:  # called only for an encrypted key
        return "" if password is None else password.reveal()

    context: ssl.SSLContext = create_ssl_context(
        cafile=settings.ca_file, certfile=settings.cert_file, keyfile=settings.key_file,
        password=key_password)
    context.check_hostname = settings.check_hostname
    return context


def client_kwargs(security: KafkaSecurity) -> dict[str, Any]:
    """aiokafka's security arguments (the same for consumers, producers and admins)."""
    kwargs: dict[str, Any] = {"security_protocol": security.protocol}
    if security.uses_ssl:
        kwargs["ssl_context"] = ssl_context(security.ssl)
    if security.uses_sasl:
        logging.getLogger("aiokafka.conn").addFilter(hide_sasl_bytes)  # once: same function
        sasl = security.sasl
        assert sasl.username is not None and sasl.password is not None  # checked by config
        kwargs.update(sasl_mechanism=sasl.mechanism, sasl_plain_username=sasl.username,
                      sasl_plain_password=sasl.password.reveal())
    return kwargs



_SASL_AUTHENTICATE = 36  # Kafka's API key of SaslAuthenticate requests and responses


def hide_sasl_bytes(record: logging.LogRecord) -> bool:
    """A log filter for aiokafka's connections: SASL exchanges logged without their bytes.

    At DEBUG aiokafka logs every request it sends, and a SaslAuthenticate
    request with mechanism PLAIN carries the password as it is.
    """
    if isinstance(record.args, tuple) and any(
            getattr(arg, "API_KEY", None) == _SASL_AUTHENTICATE for arg in record.args):
        record.args = tuple("SaslAuthenticate(bytes hidden)"
                            if getattr(arg, "API_KEY", None) == _SASL_AUTHENTICATE else arg
                            for arg in record.args)
    return True
