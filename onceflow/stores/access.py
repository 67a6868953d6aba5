"""How a worker proves who it is to a store: credentials and TLS, and their refusal.

``StoreAccess`` holds a store's user, password (a ``Secret``) and TLS files;
``redis_options`` and ``cassandra_options`` turn it into the drivers' own
arguments (redis-py's ``username``/``password``/``ssl_*``, cassandra-driver's
``auth_provider``/``ssl_context``). The password is revealed only there.

A store that refuses the credentials, the certificate or a command (an ACL
user without the permission) raises ``StoreAccessDenied``. Unlike an
unreachable store, waiting does not help: the store callers' retry policy
does not retry it, and a worker stops on it with the configuration error
(exit 2) instead of retrying for minutes.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any, Literal

from onceflow.runtime.secrets import Secret

__all__ = [
    "NO_ACCESS",
    "StoreAccess",
    "StoreAccessDenied",
    "TlsFiles",
    "access_denied",
    "cassandra_options",
    "redis_options",
]

#: What the store refused: the login, a command (permission), its own certificate
#: failing our check (tls), or our client certificate (certificate).
Refused = Literal["credentials", "permission", "tls", "certificate"]
# TLS alerts of a server that refused our client certificate (missing, or of a CA it
# does not trust); OpenSSL's reason codes.
_CLIENT_CERT_ALERTS = frozenset({
    "TLSV13_ALERT_CERTIFICATE_REQUIRED", "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_BAD_CERTIFICATE", "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
})


@dataclass(frozen=True)
class TlsFiles:
    """TLS towards a store: the CA that signed its certificate, our own certificate.

    ``ca_file`` None trusts the system's CAs; ``cert_file``/``key_file`` (PEM)
    are for a store that asks clients for a certificate.
    """

    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    check_hostname: bool

    def context(self) -> ssl.SSLContext:
        """A client context that verifies the store's certificate (and its name if asked)."""
        context = ssl.create_default_context(cafile=self.ca_file)
        context.check_hostname = self.check_hostname
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass(frozen=True)
class StoreAccess:
    """Credentials and TLS for one store; all unset: no login, plain TCP."""

    username: str | None = None
    password: Secret | None = None
    tls: TlsFiles | None = None


NO_ACCESS = StoreAccess()


class StoreAccessDenied(Exception):
    """The store refused us (``refused``: see :data:`Refused`); never retried.

    ``store`` is the store kind ("redis", "cassandra"); the message is the
    store's own reason, which never holds the password.
    """

    def __init__(self, store: str, refused: Refused, reason: str):
        super().__init__(f"{store} refused the {refused}: {reason}")
        self.store, self.refused, self.reason = store, refused, reason


def redis_options(access: StoreAccess) -> dict[str, Any]:
    """redis-py connection arguments; the ``ssl_*`` ones need a ``rediss://`` URL."""
    options: dict[str, Any] = {}
    if access.username is not None:
        options["username"] = access.username
    if access.password is not None:
        options["password"] = access.password.reveal()
    tls = access.tls
    if tls is not None:
        options.update(ssl_ca_certs=tls.ca_file, ssl_certfile=tls.cert_file,
                       ssl_keyfile=tls.key_file, ssl_check_hostname=tls.check_hostname)
    return options


def cassandra_options(access: StoreAccess) -> dict[str, Any]:
    """cassandra-driver ``Cluster`` arguments: a plain-text login and a TLS context."""
    options: dict[str, Any] = {}
    if access.username is not None:
        from cassandra.auth import PlainTextAuthProvider

        password = "" if access.password is None else access.password.reveal()
        options["auth_provider"] = PlainTextAuthProvider(access.username, password)
    if access.tls is not None:
        options["ssl_context"] = access.tls.context()
    return options


def access_denied(error: BaseException) -> StoreAccessDenied | None:
    """The refusal behind ``error`` (itself, its causes, a NoHostAvailable's errors), if any.

    Drivers wrap a refusal several ways (redis-py's AuthenticationError,
    cassandra-driver's AuthenticationFailed inside NoHostAvailable, a
    certificate failure inside a connection error), so the chain is walked.
    """
    seen: set[int] = set()
    # Each error with the store whose driver raised it or wrapped it ("" for none yet).
    pending: list[tuple[BaseException, str]] = [(error, "")]
    while pending:
        current, store = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        store = _store_of(current) or store
        found = _classify(current, store)
        if found is not None:
            return found
        pending += [(e, store) for e in (current.__cause__, current.__context__) if e is not None]
        errors = getattr(current, "errors", None)  # NoHostAvailable: host -> error
        if isinstance(errors, dict):
            pending += [(e, store) for e in errors.values() if isinstance(e, BaseException)]
    return None


def _store_of(error: BaseException) -> str | None:
    module = type(error).__module__
    return next((s for s in ("redis", "cassandra") if module.partition(".")[0] == s), None)


_REFUSALS: dict[tuple[str, str], Refused] = {
    ("redis", "AuthenticationError"): "credentials",  # WRONGPASS, NOAUTH
    ("redis", "AuthenticationWrongNumberOfArgsError"): "credentials",
    ("redis", "NoPermissionError"): "permission",  # NOPERM: the ACL user may not
    ("cassandra", "AuthenticationFailed"): "credentials",
    ("cassandra", "Unauthorized"): "permission",
}


def _classify(error: BaseException, store: str) -> StoreAccessDenied | None:
    if isinstance(error, StoreAccessDenied):
        return error
    if isinstance(error, ssl.SSLCertVerificationError) and store:  # not Kafka's, say
        return StoreAccessDenied(store, "tls", str(error))
    if isinstance(error, ssl.SSLError) and store and error.reason in _CLIENT_CERT_ALERTS:
        return StoreAccessDenied(store, "certificate", str(error))
    refused = _REFUSALS.get((_store_of(error) or "", type(error).__name__))
    return None if refused is None else StoreAccessDenied(store, refused, str(error))
