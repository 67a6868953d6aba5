"""Builds ``onceflow.kafka``'s security settings (TLS and SASL), checked at start.

Every file is opened and the TLS context built once here, so a missing CA
file, a key that does not match its certificate or a wrong key password stop
the worker at start with ``file: key: expected ...`` rather than fail each
connection later. Settings that only apply to another protocol are refused
(``ssl.ca-file`` with ``PLAINTEXT`` would leave the link unencrypted while
its operator believes otherwise). Secret values never appear in a message.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import cast

from onceflow.runtime.config_reader import Reader, show
from onceflow.runtime.kafka_security import (
    MECHANISMS,
    PROTOCOLS,
    KafkaSasl,
    KafkaSecurity,
    KafkaSsl,
    SaslMechanism,
    SecurityProtocol,
    ssl_context,
)
from onceflow.runtime.secrets import read_secret

K = "onceflow.kafka."


def kafka_security(read: Reader) -> KafkaSecurity:
    """``security-protocol``, ``ssl.*``, ``sasl-mechanism`` and ``sasl.*`` of ``onceflow.kafka``."""
    protocol = cast(SecurityProtocol, read.text(
        K + "security-protocol", "|".join(PROTOCOLS), "one of " + ", ".join(PROTOCOLS)))
    security = KafkaSecurity(protocol, _ssl(read), _sasl(read))
    if security.uses_ssl:
        _check_context(read, security.ssl)
    else:
        _refuse_set(read, protocol, "ssl.", ("ca-file", "cert-file", "key-file", "key-password",
                                             "key-password-file"), "SSL or SASL_SSL")
    if security.uses_sasl:
        if security.sasl.username is None:
            raise read.error(K + "sasl.username", f"expected a username with "
                             f"security-protocol {protocol}, got null")
        if security.sasl.password is None:
            raise read.error(K + "sasl.password", f"expected a password with security-protocol "
                             f"{protocol} (sasl.password from the environment, or "
                             "sasl.password-file), got none")
    else:
        _refuse_set(read, protocol, "sasl.", ("username", "password", "password-file"),
                    "SASL_PLAINTEXT or SASL_SSL")
    return security


def _ssl(read: Reader) -> KafkaSsl:
    s = K + "ssl."
    return KafkaSsl(
        ca_file=_pem_file(read, s + "ca-file"),
        cert_file=_pem_file(read, s + "cert-file"),
        key_file=_pem_file(read, s + "key-file"),
        key_password=read_secret(read, s + "key-password"),
        check_hostname=read.boolean(s + "check-hostname"),
    )


def _sasl(read: Reader) -> KafkaSasl:
    username = read.raw(K + "sasl.username")
    return KafkaSasl(
        mechanism=cast(SaslMechanism, read.text(
            K + "sasl-mechanism", "|".join(MECHANISMS), "one of " + ", ".join(MECHANISMS))),
        username=None if username is None else read.text(K + "sasl.username"),
        password=read_secret(read, K + "sasl.password"),
    )


def _pem_file(read: Reader, key: str) -> str | None:
    """null, or the path of a file this process can read."""
    value = read.raw(key)
    if value is None:
        return None
    path = read.text(key, expected="null or the path of a PEM file")
    if not Path(path).is_file():
        raise read.error(key, f"expected a PEM file, got {show(path)} (no such file)")
    if not os.access(path, os.R_OK):
        raise read.error(key, f"expected a readable PEM file, got {show(path)} (permission denied)")
    return path


def _refuse_set(read: Reader, protocol: str, prefix: str, names: tuple[str, ...],
                wanted: str) -> None:
    for name in names:
        if read.raw(K + prefix + name) is not None:
            raise read.error(K + prefix + name, f"set, but security-protocol is {protocol}: "
                             f"expected security-protocol {wanted} to use it, or remove it")


def _check_context(read: Reader, settings: KafkaSsl) -> None:
    """Build the TLS context once, blaming the setting that keeps it from loading."""
    s = K + "ssl."
    if settings.key_file is not None and settings.cert_file is None:
        raise read.error(s + "key-file", "expected with ssl.cert-file (the client certificate "
                         "the key belongs to), got no cert-file")
    if settings.key_password is not None and settings.cert_file is None:
        raise read.error(s + "key-password", "expected with ssl.cert-file and its encrypted "
                         "key, got no cert-file")
    try:
        ssl.create_default_context(cafile=settings.ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise read.error(s + "ca-file", "expected a PEM file of CA certificates, got "
                         f"{show(settings.ca_file)} ({_reason(exc)})") from None
    try:
        ssl_context(settings)
    except (ssl.SSLError, OSError) as exc:
        key_file = settings.key_file or settings.cert_file
        encrypted = key_file is not None and "ENCRYPTED" in Path(key_file).read_text(
            encoding="utf-8", errors="replace")
        if encrypted and "MISMATCH" not in str(exc).upper():
            got = "got none" if settings.key_password is None else "got one that does not " \
                "open it (value not shown)"
            raise read.error(s + "key-password", "expected the password of the encrypted key "
                             f"in {key_file!r}, {got}") from None
        raise read.error(s + "cert-file", "expected a PEM client certificate whose key is "
                         f"in ssl.key-file (or in the same file), got {show(settings.cert_file)} "
                         f"({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return type(exc).__name__
